#include "server/models/model_catalogue.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/models/model_kinds.h"
#include "server/repository/safetensors.h"

namespace attnserve {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Sets element `index` of `model`'s tensor `name` to `value`, on a copy:
// stored values are never written.
void SetElement(RepositoryModel& model, const std::string& name, size_t index,
                float value) {
  const StoredTensor& stored = model.tensors.at(name);
  attn::Tensor copy = attn::Tensor::Uninitialized(stored.shape);
  std::copy(stored.values().begin(), stored.values().end(), copy.data.begin());
  copy.data[index] = value;
  model.tensors[name] = std::move(copy);
}

// A safetensors file whose `keys` are F16 (a dtype the server does not
// serve) beside F32 `values`: written by hand, as SerializeSafetensors
// writes only the dtypes served.
std::string HalfPrecisionKeys() {
  const std::string header =
      R"({"keys":{"dtype":"F16","shape":[5,4],"data_offsets":[0,40]},)"
      R"("values":{"dtype":"F32","shape":[5,3],"data_offsets":[40,100]}})";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) {
    file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  }
  return file + header + std::string(100, '\0');
}

class ModelCatalogueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/attnserve-models-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    repository_ = LoadModelRepository(dir_).value();
  }
  void TearDown() override {
    EXPECT_EQ(std::system(("rm -rf '" + dir_ + "'").c_str()), 0);
  }

  // A fitted model holding its bandwidth alone (saved before fitted models
  // held their training set).
  absl::Status SaveBandwidthOnly(const std::string& name, float bandwidth) {
    return repository_->SaveModel({"test", "a bandwidth"}, name,
                                  FittedNadarayaWatsonModel(name, bandwidth));
  }

  RepositoryModel Additive(const std::string& name, int h_k) {
    RepositoryModel model;
    model.config.set_name(name);
    model.config.set_backend(AdditiveAttentionKind().backend);
    model.tensors["W_q"] = attn::Tensor::Zeros({4, 2});
    model.tensors["W_k"] = attn::Tensor::Zeros({h_k, 3});
    model.tensors["w_v"] = attn::Tensor::Zeros({4});
    return model;
  }

  std::string dir_;
  std::unique_ptr<ModelRepository> repository_;
};

TEST_F(ModelCatalogueTest, ResolvesBuiltInAndStoredModelsByTheirKind) {
  ModelCatalogue catalogue(repository_.get());
  ASSERT_TRUE(SaveBandwidthOnly("fitted", 0.5f).ok());
  ASSERT_TRUE(repository_->SaveModel({"test", "weights"}, "mlp",
                                     Additive("mlp", 4))
                  .ok());
  EXPECT_THAT(catalogue.Names(),
              ElementsAre("masked_softmax", "batch_matmul",
                          "dot_product_attention", "nadaraya_watson",
                          "fitted", "mlp"));

  absl::StatusOr<ServedModel> built_in =
      catalogue.Resolve("dot_product_attention", "1");
  ASSERT_TRUE(built_in.ok()) << built_in.status();
  EXPECT_TRUE(built_in->kind->built_in());
  EXPECT_EQ(built_in->stored, nullptr);
  EXPECT_EQ(built_in->signature.operation,
            Operation::kScaledDotProductAttention);

  absl::StatusOr<ServedModel> fitted = catalogue.Resolve("fitted", "");
  ASSERT_TRUE(fitted.ok()) << fitted.status();
  EXPECT_EQ(fitted->kind, &FittedNadarayaWatsonKind());
  EXPECT_EQ(fitted->signature.name, "fitted");
  EXPECT_EQ(fitted->stored->tensors.at("bandwidth").data[0], 0.5f);

  EXPECT_EQ(catalogue.Resolve("mlp", "")->kind, &AdditiveAttentionKind());
  EXPECT_EQ(catalogue.Resolve("mlp", "2").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(catalogue.Resolve("absent", "").status().message()),
              HasSubstr("served: masked_softmax"));

  // A stored model named in a request field must be of the kind it needs.
  EXPECT_TRUE(catalogue.ResolveStored("weights_name", "mlp",
                                      AdditiveAttentionKind())
                  .ok());
  const absl::Status wrong_kind =
      catalogue.ResolveStored("weights_name", "fitted", AdditiveAttentionKind())
          .status();
  EXPECT_EQ(wrong_kind.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(wrong_kind.message()),
              HasSubstr("weights_name: no additive_attention model 'fitted'"));
}

// What a stored model holds is checked once, by its kind, whether it is
// saved or loaded: nothing half-made is served.
TEST_F(ModelCatalogueTest, EachKindChecksWhatItsModelsHold) {
  const absl::Status mismatched =
      repository_->SaveModel({"test", "weights"}, "mlp", Additive("mlp", 5));
  EXPECT_EQ(mismatched.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mismatched.message()),
              HasSubstr("must share their first dimension h"));
  RepositoryModel unknown = Additive("odd", 4);
  unknown.config.set_backend("no_such_backend");
  EXPECT_THAT(std::string(CheckStoredModel("odd", unknown).message()),
              HasSubstr("backend 'no_such_backend' is not one of"));
  const float x[] = {1.0f}, y[] = {2.0f};
  const attn::TensorView x_train{x, {1}}, y_train{y, {1}};
  EXPECT_EQ(ModelCatalogue(repository_.get())
                .SaveFittedModel("w", -1.0f, x_train, y_train)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(repository_->Find("mlp"), nullptr);
  EXPECT_EQ(repository_->Find("w"), nullptr);
  EXPECT_EQ(ModelCatalogue(nullptr)
                .SaveFittedModel("w", 1.0f, x_train, y_train)
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

// A stored memory holds keys [N, d] and values [N, v] of one N, finite, and
// a score and scale it can use; anything else is refused naming the model
// and the tensor or parameter, and nothing half-made is served.
TEST_F(ModelCatalogueTest, AnAttentionMemoryIsCheckedWhenStored) {
  auto memory = [](attn::Shape keys, attn::Shape values) {
    RepositoryModel model;
    model.config.set_name("memory");
    model.config.set_backend(AttentionMemoryKind().backend);
    model.tensors["keys"] = attn::Tensor::Zeros(std::move(keys));
    model.tensors["values"] = attn::Tensor::Zeros(std::move(values));
    return model;
  };
  auto refusal = [&](RepositoryModel model) {
    return std::string(repository_
                           ->SaveModel({"test", "a memory"}, "memory",
                                       std::move(model))
                           .message());
  };
  EXPECT_TRUE(repository_->SaveModel({"test", "a memory"}, "memory",
                                     memory({5, 4}, {5, 3}))
                  .ok());
  EXPECT_EQ(repository_->Find("memory")->tensors.at("keys").shape,
            (attn::Shape{5, 4}));
  EXPECT_THAT(refusal(memory({5, 4}, {6, 3})),
              HasSubstr("memory: keys (5, 4) and values (6, 3) must be"));
  EXPECT_THAT(refusal(memory({5}, {5, 3})),
              HasSubstr("memory: backend attention_memory needs a rank-2 "
                        "tensor 'keys'"));
  RepositoryModel missing = memory({5, 4}, {5, 3});
  missing.tensors.erase("values");
  EXPECT_THAT(refusal(std::move(missing)), HasSubstr("tensor 'values'"));
  RepositoryModel nan = memory({5, 4}, {5, 3});
  SetElement(nan, "values", 7, std::nanf(""));
  EXPECT_THAT(refusal(std::move(nan)),
              HasSubstr("memory: tensor 'values' element 7 is nan"));
  RepositoryModel infinite = memory({5, 4}, {5, 3});
  SetElement(infinite, "keys", 0, INFINITY);
  EXPECT_THAT(refusal(std::move(infinite)),
              HasSubstr("memory: tensor 'keys' element 0 is inf"));
  RepositoryModel score = memory({5, 4}, {5, 3});
  (*score.config.mutable_parameters())["score"].set_string_value("cosine");
  EXPECT_THAT(refusal(std::move(score)),
              HasSubstr("memory: parameter 'score': 'cosine' is not one of"));
  for (const char* bad : {"0", "-1", "x", "1e99", "nan", ""}) {
    RepositoryModel scale = memory({5, 4}, {5, 3});
    (*scale.config.mutable_parameters())["scale"].set_string_value(bad);
    EXPECT_THAT(refusal(std::move(scale)),
                HasSubstr("memory: parameter 'scale'")) << bad;
  }
  // The first, whole version still serves.
  EXPECT_EQ(repository_->Find("memory")->tensors.at("values").shape,
            (attn::Shape{5, 3}));
  EXPECT_TRUE(ModelCatalogue(repository_.get()).Resolve("memory", "").ok());
}

// A memory's file replaced on disk by a bad one (an operator's copy, a
// shared volume) and reloaded: refused naming the model's file and the
// tensor, and the version loaded before serves on. --max_model_bytes
// bounds the reload too.
TEST_F(ModelCatalogueTest, ABadMemoryOnDiskIsRefusedWhenLoaded) {
  auto memory_file = [](attn::Shape keys, attn::Shape values) {
    std::map<std::string, attn::Tensor> tensors;
    tensors["keys"] = attn::Tensor::Zeros(std::move(keys));
    tensors["keys"].data[0] = 1.0f;
    tensors["values"] = attn::Tensor::Zeros(std::move(values));
    return tensors;
  };
  const std::string good = SerializeSafetensors(memory_file({5, 4}, {5, 3}));
  ModelRepository::Options options;
  options.dir = dir_;
  options.max_model_bytes = static_cast<int64_t>(good.size()) + 64;
  std::unique_ptr<ModelRepository> repository =
      LoadModelRepository(options).value();
  ModelCatalogue catalogue(repository.get(),
                           ModelControl{/*explicit_mode=*/true, /*needs_permission=*/false,
                                        /*on_event=*/{}});
  RepositoryModel first;
  first.config.set_name("mem");
  first.config.set_backend(AttentionMemoryKind().backend);
  for (auto& [name, tensor] : memory_file({5, 4}, {5, 3})) {
    first.tensors[name] = std::move(tensor);
  }
  ASSERT_TRUE(
      repository->SaveModel({"test", "a memory"}, "mem", std::move(first)).ok());
  const std::string file = dir_ + "/mem/weights.safetensors";
  auto replace_file = [&](const std::string& bytes) {
    // A new file under the name, as cp or an editor leaves it.
    ASSERT_EQ(unlink(file.c_str()), 0);
    std::ofstream(file, std::ios::binary) << bytes;
  };

  auto nan = memory_file({5, 4}, {5, 3});
  nan["values"].data[4] = std::nanf("");
  auto missing = memory_file({5, 4}, {5, 3});
  missing.erase("values");
  auto mismatched = memory_file({5, 4}, {6, 3});
  auto flat = memory_file({20}, {5, 3});
  struct Refusal {
    std::string bytes;
    absl::StatusCode code;
    std::vector<std::string> says;
  };
  const Refusal refusals[] = {
      {HalfPrecisionKeys(), absl::StatusCode::kInvalidArgument,
       {"mem/weights.safetensors", "tensor 'keys' is F16"}},
      {SerializeSafetensors(nan), absl::StatusCode::kInvalidArgument,
       {"mem", "tensor 'values' element 4 is nan"}},
      {SerializeSafetensors(missing), absl::StatusCode::kInvalidArgument,
       {"mem", "tensor 'values'"}},
      {SerializeSafetensors(mismatched), absl::StatusCode::kInvalidArgument,
       {"mem", "keys (5, 4) and values (6, 3)"}},
      {SerializeSafetensors(flat), absl::StatusCode::kInvalidArgument,
       {"mem", "rank-2 tensor 'keys'"}},
      {good.substr(0, good.size() - 9), absl::StatusCode::kInvalidArgument,
       {"mem/weights.safetensors"}},
      {SerializeSafetensors(memory_file({50, 4}, {50, 3})),
       absl::StatusCode::kResourceExhausted,
       {"mem/weights.safetensors", "--max_model_bytes"}},
  };
  for (const Refusal& refusal : refusals) {
    replace_file(refusal.bytes);
    const absl::Status status = catalogue.Load(true, "mem", {});
    EXPECT_EQ(status.code(), refusal.code) << status;
    for (const std::string& part : refusal.says) {
      EXPECT_THAT(std::string(status.message()), HasSubstr(part));
    }
    // The version loaded before serves on, and the index says why.
    absl::StatusOr<ServedModel> served = catalogue.Resolve("mem", "");
    ASSERT_TRUE(served.ok()) << served.status();
    EXPECT_EQ(served->stored->tensors.at("keys").shape, (attn::Shape{5, 4}));
    EXPECT_EQ(served->stored->tensors.at("keys").data[0], 1.0f);
    ASSERT_EQ(repository->Index().size(), 1u);
    EXPECT_EQ(repository->Index()[0].state, "READY");
    EXPECT_THAT(repository->Index()[0].reason, HasSubstr("failed to reload"));
  }
  // Mended, it reloads.
  replace_file(good);
  EXPECT_TRUE(catalogue.Load(true, "mem", {}).ok());
}

// The kinds read their parameters whatever wire they came by, with the
// types the protocol has.
// BF16 tensors: a memory holds both keys and values as BF16 or neither,
// finite (an exponent of all ones is refused, naming the element); the
// other kinds hold F32 only. A call on a BF16 memory carries its bits to
// the library, at bfloat16 precision.
TEST_F(ModelCatalogueTest, BFloat16TensorsOnlyInMemories) {
  auto bfloat16 = [](attn::Shape shape, uint16_t bits) {
    const int64_t count = attn::TensorView{nullptr, shape}.num_elements();
    auto values = std::make_shared<std::vector<uint16_t>>(count, bits);
    const uint16_t* data = values->data();
    return StoredTensor(std::move(shape), data, std::move(values));
  };
  auto save = [&](const std::string& backend,
                  std::map<std::string, StoredTensor> tensors) {
    RepositoryModel model;
    model.config.set_name("m16");
    model.config.set_backend(backend);
    model.tensors = std::move(tensors);
    return repository_->SaveModel({"test", "a model"}, "m16", std::move(model));
  };
  const uint16_t one = 0x3f80;  // 1.0
  EXPECT_THAT(std::string(save("attention_memory",
                               {{"keys", bfloat16({4, 2}, one)},
                                {"values", attn::Tensor::Zeros({4, 3})}})
                              .message()),
              HasSubstr("keys and values must both be F32 or both BF16"));
  std::map<std::string, StoredTensor> nan = {
      {"keys", bfloat16({4, 2}, one)}, {"values", bfloat16({4, 3}, 0x7fc0)}};
  EXPECT_THAT(std::string(save("attention_memory", nan).message()),
              HasSubstr("tensor 'values' element 0 is nan"));
  EXPECT_THAT(std::string(save("additive_attention",
                               {{"W_q", bfloat16({2, 2}, one)},
                                {"W_k", attn::Tensor::Zeros({2, 2})},
                                {"w_v", attn::Tensor::Zeros({2})}})
                              .message()),
              HasSubstr("tensor 'W_q' is BF16; backend additive_attention "
                        "holds F32 tensors only"));
  ASSERT_TRUE(save("attention_memory", {{"keys", bfloat16({4, 2}, one)},
                                        {"values", bfloat16({4, 3}, one)}})
                  .ok());
  ModelCatalogue catalogue(repository_.get());
  absl::StatusOr<ServedModel> memory = catalogue.Resolve("m16", "");
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_TRUE(memory->stored->weights_mapped);
  const float queries[2] = {0.5f, -0.5f};
  ModelInputs inputs;
  inputs.floats["queries"] = attn::TensorView{queries, {1, 1, 2}};
  absl::StatusOr<OperationRequest> built = memory->kind->build_request(
      KindArguments{"m16", ModelParameters{}, inputs, memory->stored.get(),
                    false});
  ASSERT_TRUE(built.ok()) << built.status();
  const attn::AttentionRequest& attention = std::get<attn::AttentionRequest>(
      std::get<StoredRequest>(*built).request);
  EXPECT_EQ(attention.keys_bfloat16,
            memory->stored->tensors.at("keys").bfloat16);
  EXPECT_EQ(attention.keys.data, nullptr);
  EXPECT_EQ(attention.precision, attn::Precision::kBFloat16);
}

TEST_F(ModelCatalogueTest, KindsReadTheirParameters) {
  ModelCatalogue catalogue(repository_.get());
  ASSERT_TRUE(SaveBandwidthOnly("fitted", 0.5f).ok());
  const ModelKind& built_in = *catalogue.Resolve("nadaraya_watson", "")->kind;
  const ServedModel fitted = *catalogue.Resolve("fitted", "");
  ModelInputs inputs;
  auto build = [&](const ServedModel* model, const ModelParameters& parameters,
                   const ModelKind& kind) {
    return kind.build_request(KindArguments{
        "m", parameters, inputs,
        model == nullptr ? nullptr : model->stored.get(), false});
  };
  auto nadaraya_watson = [](const absl::StatusOr<OperationRequest>& request) {
    return std::get<attn::NadarayaWatsonRequest>(*request);
  };
  EXPECT_EQ(nadaraya_watson(build(nullptr, {}, built_in)).bandwidth, 1.0f);
  EXPECT_EQ(nadaraya_watson(build(nullptr, {{"bandwidth", 2.5}}, built_in))
                .bandwidth,
            2.5f);
  EXPECT_EQ(nadaraya_watson(
                build(nullptr, {{"bandwidth", int64_t{3}}}, built_in))
                .bandwidth,
            3.0f);
  EXPECT_THAT(std::string(build(nullptr, {{"bandwidth", std::string("x")}},
                                built_in)
                              .status()
                              .message()),
              HasSubstr("parameter 'bandwidth': must be a number"));
  EXPECT_EQ(nadaraya_watson(build(nullptr,
                                  {{"kernel", std::string("boxcar")}},
                                  built_in))
                .kernel,
            attn::RegressionKernel::kBoxcar);
  EXPECT_THAT(std::string(build(nullptr, {{"kernel", int64_t{1}}}, built_in)
                              .status()
                              .message()),
              HasSubstr("parameter 'kernel': '' is not one of"));
  // A fitted model serves its own bandwidth and refuses another.
  EXPECT_EQ(nadaraya_watson(build(&fitted, {}, *fitted.kind)).bandwidth, 0.5f);
  EXPECT_THAT(std::string(build(&fitted, {{"bandwidth", 2.0}}, *fitted.kind)
                              .status()
                              .message()),
              HasSubstr("serves its fitted bandwidth"));
}

// FitBandwidth's save_as stores the training set beside the bandwidth: the
// model takes x_query alone and computes over what it holds, with the
// Gaussian kernel the fit used; calls on it share the stored set by
// identity (the batcher's class), never by copying it.
TEST_F(ModelCatalogueTest, AFittedModelHoldsItsTrainingSet) {
  ModelCatalogue catalogue(repository_.get());
  const float x[] = {0.0f, 1.0f, 2.0f, 3.0f}, y[] = {1.0f, 3.0f, 2.0f, 5.0f};
  ASSERT_TRUE(catalogue
                  .SaveFittedModel("net", 1.5f, attn::TensorView{x, {4}},
                                   attn::TensorView{y, {4}})
                  .ok());
  const ServedModel net = *catalogue.Resolve("net", "");
  EXPECT_EQ(net.kind, &TrainedNadarayaWatsonKind());
  ASSERT_EQ(net.signature.inputs.size(), 1u);
  EXPECT_EQ(net.signature.inputs[0].name, "x_query");
  EXPECT_EQ(net.signature.name, "net");
  EXPECT_EQ(net.stored->config.parameters().at("kernel").string_value(),
            "gaussian");

  const float queries[] = {0.5f, 2.5f};
  ModelInputs inputs;
  inputs.floats["x_query"] = attn::TensorView{queries, {2}};
  auto build = [&](const ModelParameters& parameters) {
    return net.kind->build_request(
        KindArguments{"net", parameters, inputs, net.stored.get(), true});
  };
  absl::StatusOr<OperationRequest> built = build({});
  ASSERT_TRUE(built.ok()) << built.status();
  const auto& op = std::get<StoredRequest>(*built);
  EXPECT_EQ(op.version, net.stored.get());
  const auto& regression = std::get<attn::NadarayaWatsonRequest>(op.request);
  EXPECT_EQ(regression.x_train.data, net.stored->tensors.at("x_train").data);
  EXPECT_EQ(regression.y_train.shape, (attn::Shape{4}));
  EXPECT_EQ(regression.x_query.data, queries);
  EXPECT_EQ(regression.bandwidth, 1.5f);
  EXPECT_EQ(regression.kernel, attn::RegressionKernel::kGaussian);
  EXPECT_TRUE(regression.return_weights);
  EXPECT_EQ(op.output_shape, (attn::Shape{2}));
  EXPECT_EQ(op.weights_shape, (attn::Shape{2, 4}));
  EXPECT_FALSE(net.kind->gains_from_batching);  // measured: it does not pay
  // Its bandwidth and kernel are what was fitted: a call's are refused.
  EXPECT_THAT(std::string(build({{"bandwidth", 2.0}}).status().message()),
              HasSubstr("serves its fitted bandwidth"));
  EXPECT_THAT(std::string(build({{"kernel", std::string("boxcar")}})
                              .status()
                              .message()),
              HasSubstr("model 'net' serves its own kernel, gaussian"));

  // A typed call names it by its backend; a model of another backend is
  // not one.
  EXPECT_EQ(catalogue
                .ResolveStored("model_name", "net", FittedNadarayaWatsonKind())
                ->kind,
            &TrainedNadarayaWatsonKind());
  ASSERT_TRUE(SaveBandwidthOnly("bandwidth_only", 0.5f).ok());
  EXPECT_EQ(catalogue
                .ResolveStored("model_name", "bandwidth_only",
                               FittedNadarayaWatsonKind())
                ->kind,
            &FittedNadarayaWatsonKind());
}

// A training set is both tensors, of one N, rank 1 or 2, finite, and a
// kernel the library has; anything else is refused naming the model and
// the tensor or parameter, and the version before serves on.
TEST_F(ModelCatalogueTest, AStoredTrainingSetIsChecked) {
  const float x[] = {0.0f, 1.0f}, y[] = {1.0f, 3.0f};
  auto model = [&]() {
    return TrainedNadarayaWatsonModel("net", 1.0f, attn::TensorView{x, {2}},
                                      attn::TensorView{y, {2}});
  };
  auto refusal = [&](RepositoryModel bad) {
    const absl::Status status =
        repository_->SaveModel({"test", "a regression"}, "net", std::move(bad));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    return std::string(status.message());
  };
  ASSERT_TRUE(repository_->SaveModel({"test", "a regression"}, "net", model())
                  .ok());
  RepositoryModel half = model();
  half.tensors.erase("y_train");
  EXPECT_THAT(refusal(std::move(half)),
              HasSubstr("net: a nadaraya_watson model with a training set "
                        "holds both x_train [N] or [N, dx] and y_train [N] or "
                        "[N, dy]; 'y_train' is missing"));
  RepositoryModel deep = model();
  deep.tensors["x_train"] = attn::Tensor::Zeros({2, 1, 1});
  EXPECT_THAT(refusal(std::move(deep)),
              HasSubstr("'x_train' is of shape (2, 1, 1)"));
  RepositoryModel mismatched = model();
  mismatched.tensors["y_train"] = attn::Tensor::Zeros({3});
  EXPECT_THAT(refusal(std::move(mismatched)),
              HasSubstr("net: x_train (2) and y_train (3) must hold the same N"));
  RepositoryModel empty = model();
  empty.tensors["x_train"] = attn::Tensor::Zeros({0});
  empty.tensors["y_train"] = attn::Tensor::Zeros({0});
  EXPECT_THAT(refusal(std::move(empty)), HasSubstr("the same N >= 1"));
  RepositoryModel no_features = model();
  no_features.tensors["x_train"] = attn::Tensor::Zeros({2, 0});
  EXPECT_THAT(refusal(std::move(no_features)), HasSubstr("at least one value"));
  RepositoryModel nan = model();
  SetElement(nan, "y_train", 1, std::nanf(""));
  EXPECT_THAT(refusal(std::move(nan)),
              HasSubstr("net: tensor 'y_train' element 1 is nan; a training "
                        "set holds finite values only"));
  RepositoryModel infinite = model();
  SetElement(infinite, "x_train", 0, -INFINITY);
  EXPECT_THAT(refusal(std::move(infinite)),
              HasSubstr("tensor 'x_train' element 0 is -inf"));
  RepositoryModel kernel = model();
  (*kernel.config.mutable_parameters())["kernel"].set_string_value("cosine");
  EXPECT_THAT(refusal(std::move(kernel)),
              HasSubstr("net: parameter 'kernel': 'cosine' is not one of"));
  // The first, whole version still serves.
  EXPECT_EQ(repository_->Find("net")->tensors.at("x_train").data[1], 1.0f);
}

// A bandwidth-only model whose config sets a kernel serves it, as a
// trained one does; without one the call's kernel is used, as before.
TEST_F(ModelCatalogueTest, AStoredKernelIsTheModels) {
  RepositoryModel boxcar = FittedNadarayaWatsonModel("boxcar", 0.5f);
  (*boxcar.config.mutable_parameters())["kernel"].set_string_value("boxcar");
  ASSERT_TRUE(
      repository_->SaveModel({"test", "a bandwidth"}, "boxcar", boxcar).ok());
  ASSERT_TRUE(SaveBandwidthOnly("plain", 0.5f).ok());
  ModelCatalogue catalogue(repository_.get());
  ModelInputs inputs;
  auto kernel_of = [&](const std::string& name,
                       const ModelParameters& parameters) {
    const ServedModel model = *catalogue.Resolve(name, "");
    return model.kind
        ->build_request(KindArguments{name, parameters, inputs,
                                      model.stored.get(), false})
        .value();
  };
  EXPECT_EQ(std::get<attn::NadarayaWatsonRequest>(kernel_of("boxcar", {})).kernel,
            attn::RegressionKernel::kBoxcar);
  EXPECT_EQ(std::get<attn::NadarayaWatsonRequest>(
                kernel_of("plain", {{"kernel", std::string("constant")}}))
                .kernel,
            attn::RegressionKernel::kConstant);
  const ServedModel model = *catalogue.Resolve("boxcar", "");
  EXPECT_THAT(std::string(model.kind
                              ->build_request(KindArguments{
                                  "boxcar",
                                  {{"kernel", std::string("boxcar")}},
                                  inputs, model.stored.get(), false})
                              .status()
                              .message()),
              HasSubstr("serves its own kernel, boxcar"));
}

// An unknown model's NOT_FOUND names a handful of the served models and how
// many more there are, however many a repository serves.
TEST_F(ModelCatalogueTest, NotFoundNamesAHandfulOfModels) {
  ModelCatalogue catalogue(repository_.get());
  for (int i = 0; i < 30; ++i) {
    ASSERT_TRUE(SaveBandwidthOnly(absl::StrCat("fitted_", i), 0.5f).ok());
  }
  const size_t served = catalogue.Names().size();
  ASSERT_GT(served, 30u);
  const std::string message(catalogue.Resolve("absent", "").status().message());
  EXPECT_THAT(message, HasSubstr("served: masked_softmax"));
  EXPECT_THAT(message, HasSubstr(absl::StrCat(" and ", served - 8, " more")));
  EXPECT_LT(message.size(), 300u);
}

// Every change to the served models, and every refused attempt at one, is
// reported once, as it happened, with the reason for a refusal.
TEST_F(ModelCatalogueTest, EveryChangeAndRefusalIsReported) {
  std::vector<ModelEvent> events;
  ModelControl control{/*explicit_mode=*/true, /*needs_permission=*/true,
                       /*on_event=*/[&events](const ModelEvent& event) {
                         events.push_back(event);
                       }};
  ModelCatalogue catalogue(repository_.get(), control);
  std::map<std::string, attn::Tensor> tensors;
  tensors["keys"] = attn::Tensor::Zeros({5, 4});
  tensors["values"] = attn::Tensor::Zeros({5, 3});
  const ModelUpload good{R"({"name": "mem", "backend": "attention_memory"})",
                         {{"file:weights.safetensors",
                           SerializeSafetensors(tensors)}}};
  const ModelUpload bad{good.config_json,
                        {{"file:weights.safetensors", "not safetensors"}}};
  const std::vector<std::string> upload = {"config",
                                           "file:weights.safetensors"};
  const float x[] = {0.0f, 1.0f}, y[] = {1.0f, 2.0f};
  EXPECT_FALSE(catalogue.Load(/*may_control_models=*/false, "mem", upload, good)
                   .ok());
  EXPECT_TRUE(catalogue.Load(true, "mem", upload, good).ok());
  EXPECT_TRUE(catalogue.Load(true, "mem", upload, good).ok());
  EXPECT_FALSE(catalogue.Load(true, "mem", upload, bad).ok());
  EXPECT_TRUE(catalogue.Unload(true, "mem", {}).ok());
  EXPECT_FALSE(catalogue.Unload(true, "masked_softmax", {}).ok());
  EXPECT_TRUE(catalogue.Load(true, "masked_softmax", {}).ok());  // no change
  EXPECT_FALSE(catalogue.CheckSaveAllowed(/*may_save=*/false, "net").ok());
  EXPECT_TRUE(catalogue.CheckSaveAllowed(true, "net").ok());  // no change yet
  EXPECT_TRUE(catalogue
                  .SaveFittedModel("net", 1.5f, attn::TensorView{x, {2}},
                                   attn::TensorView{y, {2}})
                  .ok());
  EXPECT_TRUE(catalogue
                  .SaveFittedModel("net", 2.5f, attn::TensorView{x, {2}},
                                   attn::TensorView{y, {2}})
                  .ok());
  struct Expected {
    const char* event;
    const char* model;
    bool ok;
    const char* reason;  // in the refusal's message
  };
  const Expected expected[] = {
      {"load", "mem", false, "may not load or unload models"},
      {"load", "mem", true, ""},
      {"replace", "mem", true, ""},
      {"replace", "mem", false, "nothing was written"},
      {"unload", "mem", true, ""},
      {"unload", "masked_softmax", false, "is built in and always served"},
      {"save", "net", false, "may not write models"},
      {"save", "net", true, ""},
      {"replace", "net", true, ""},
  };
  ASSERT_EQ(events.size(), std::size(expected));
  for (size_t i = 0; i < events.size(); ++i) {
    SCOPED_TRACE(events[i].Describe());
    EXPECT_EQ(events[i].event, expected[i].event);
    EXPECT_EQ(events[i].model, expected[i].model);
    EXPECT_EQ(events[i].status.ok(), expected[i].ok);
    EXPECT_THAT(std::string(events[i].status.message()),
                HasSubstr(expected[i].reason));
    EXPECT_THAT(events[i].Describe(),
                HasSubstr(expected[i].ok ? "done" : "refused"));
  }
}

// The process's peak resident memory (VmHWM), reset to the current
// resident memory by ResetPeakMemory.
int64_t PeakMemoryBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      return std::atoll(line.c_str() + 6) * 1024;  // "VmHWM:   123 kB"
    }
  }
  return -1;
}
bool ResetPeakMemory() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";  // resets VmHWM (Linux >= 4.0)
  clear.close();
  return clear.good();
}

// An accepted upload costs the bytes it came in and, while its written file
// is checked against them, that file's pages: its bytes are moved from the
// request into the model and written as they are, never copied (a 64 MiB
// upload raised the peak by three times its size when it was copied into
// the upload, parsed from a copy and serialized again to be written).
TEST_F(ModelCatalogueTest, AnUploadIsNeverCopied) {
  ModelCatalogue catalogue(repository_.get(),
                           ModelControl{/*explicit_mode=*/true, /*needs_permission=*/false,
                                        /*on_event=*/{}});
  constexpr int64_t kEntries = 131072, kWidth = 64;  // 64 MiB of F32
  std::string bytes;
  {
    std::map<std::string, attn::Tensor> tensors;
    tensors["keys"] = attn::Tensor::Zeros({kEntries, kWidth});
    tensors["values"] = attn::Tensor::Zeros({kEntries, kWidth});
    for (int64_t i = 0; i < kEntries * kWidth; i += 997) {
      tensors["keys"].data[i] = 1.0f;
    }
    bytes = SerializeSafetensors(tensors);
  }
  const int64_t file_bytes = static_cast<int64_t>(bytes.size());
  ModelUpload upload{R"({"name": "big", "backend": "attention_memory"})",
                     {{"file:weights.safetensors", std::move(bytes)}}};
  ASSERT_TRUE(ResetPeakMemory());
  const int64_t before = PeakMemoryBytes();
  ASSERT_GT(before, 0);
  const absl::Status loaded =
      catalogue.Load(true, "big", {"config", "file:weights.safetensors"},
                     std::move(upload));
  const int64_t rise = PeakMemoryBytes() - before;
  ASSERT_TRUE(loaded.ok()) << loaded;
  EXPECT_TRUE(catalogue.Resolve("big", "")->stored->weights_mapped);
  // The written file's pages, read once to check them, and a little more
  // (under AddressSanitizer, its shadow of what was touched: 1/8). One copy
  // of the bytes would be twice the file.
  EXPECT_LE(rise, file_bytes + file_bytes / 4)
      << "an upload of " << file_bytes << " bytes raised the peak by "
      << rise;
}

// An upload (Triton's load with `config` and `file:weights.safetensors`)
// is written with the crash-safe save and served; whatever is wrong with
// one is refused naming the parameter, and the model served before, and
// its files, stay as they were.
TEST_F(ModelCatalogueTest, UploadsAreCheckedThenSavedWhole) {
  ModelCatalogue catalogue(repository_.get(),
                           ModelControl{/*explicit_mode=*/true, /*needs_permission=*/true,
                                        /*on_event=*/{}});
  auto memory_bytes = [](float first_key) {
    std::map<std::string, attn::Tensor> tensors;
    tensors["keys"] = attn::Tensor::Zeros({5, 4});
    tensors["keys"].data[0] = first_key;
    tensors["values"] = attn::Tensor::Zeros({5, 3});
    return SerializeSafetensors(tensors);
  };
  const std::string config =
      R"({"name": "mem", "backend": "attention_memory",)"
      R"( "parameters": {"score": {"string_value": "gaussian"}}})";
  auto upload = [&](std::string config_json,
                    std::map<std::string, std::string> files) {
    return std::optional<ModelUpload>(
        ModelUpload{std::move(config_json), std::move(files)});
  };
  auto names = [](const std::optional<ModelUpload>& u) {
    std::vector<std::string> list;
    if (!u->config_json.empty()) list.push_back("config");
    for (const auto& [name, bytes] : u->files) list.push_back(name);
    return list;
  };
  auto load = [&](const std::optional<ModelUpload>& u, bool may = true,
                  const std::string& name = "mem") {
    return catalogue.Load(may, name, names(u), u);
  };
  const auto good = upload(config, {{"file:weights.safetensors", memory_bytes(1.0f)}});
  EXPECT_EQ(load(good, /*may=*/false).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(repository_->Find("mem"), nullptr);
  ASSERT_TRUE(load(good).ok()) << load(good);
  const ServedModel served = *catalogue.Resolve("mem", "");
  EXPECT_EQ(served.kind, &AttentionMemoryKind());
  EXPECT_EQ(served.stored->tensors.at("keys").data[0], 1.0f);
  EXPECT_EQ(served.stored->config.parameters().at("score").string_value(),
            "gaussian");
  auto on_disk = [&] {
    std::ifstream file(dir_ + "/mem/weights.safetensors", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(file), {});
  };
  const std::string saved = on_disk();
  ASSERT_FALSE(saved.empty());

  const std::string other = memory_bytes(2.0f);
  struct Refusal {
    std::optional<ModelUpload> upload;
    absl::StatusCode code;
    const char* message;
  };
  std::map<std::string, attn::Tensor> nan_tensors =
      ParseSafetensors(other).value();
  nan_tensors["values"].data[4] = std::nanf("");
  std::map<std::string, attn::Tensor> mismatched =
      ParseSafetensors(other).value();
  mismatched["values"] = attn::Tensor::Zeros({6, 3});
  std::map<std::string, attn::Tensor> flat_keys = ParseSafetensors(other).value();
  flat_keys["keys"] = attn::Tensor::Zeros({20});
  const Refusal refusals[] = {
      {upload(config, {{"file:../mem2/weights.safetensors", other}}),
       absl::StatusCode::kInvalidArgument,
       "parameter 'file:../mem2/weights.safetensors': a model has one file"},
      {upload(config, {{"file:/tmp/weights.safetensors", other}}),
       absl::StatusCode::kInvalidArgument, "parameter 'file:/tmp/"},
      {upload(config, {{"file:1/weights.safetensors", other}}),
       absl::StatusCode::kInvalidArgument, "no folders, no other names"},
      {upload(config, {{"file:config.pbtxt", "name: \"x\""},
                       {"file:weights.safetensors", other}}),
       absl::StatusCode::kInvalidArgument, "parameter 'file:config.pbtxt'"},
      {upload(config, {}), absl::StatusCode::kInvalidArgument,
       "config: an upload is both"},
      {upload("", {{"file:weights.safetensors", other}}),
       absl::StatusCode::kInvalidArgument,
       "file:weights.safetensors: an upload is both"},
      {upload("name: mem", {{"file:weights.safetensors", other}}),
       absl::StatusCode::kInvalidArgument,
       "config: not an inference.ModelConfig in JSON"},
      {upload(R"({"name": "other", "backend": "attention_memory"})",
              {{"file:weights.safetensors", other}}),
       absl::StatusCode::kInvalidArgument,
       "config: name 'other' differs from model_name 'mem'"},
      {upload(R"({"backend": "no_such_backend"})",
              {{"file:weights.safetensors", other}}),
       absl::StatusCode::kInvalidArgument, "backend 'no_such_backend'"},
      {upload(config, {{"file:weights.safetensors",
                        other.substr(0, other.size() - 7)}}),
       absl::StatusCode::kInvalidArgument, "mem: file:weights.safetensors: "},
      {upload(config, {{"file:weights.safetensors", HalfPrecisionKeys()}}),
       absl::StatusCode::kInvalidArgument,
       "mem: file:weights.safetensors: safetensors: tensor 'keys' is F16"},
      {upload(config, {{"file:weights.safetensors",
                        SerializeSafetensors(flat_keys)}}),
       absl::StatusCode::kInvalidArgument,
       "mem: backend attention_memory needs a rank-2 tensor 'keys'"},
      {upload(config, {{"file:weights.safetensors",
                        SerializeSafetensors(nan_tensors)}}),
       absl::StatusCode::kInvalidArgument,
       "mem: tensor 'values' element 4 is nan"},
      {upload(config, {{"file:weights.safetensors",
                        SerializeSafetensors(mismatched)}}),
       absl::StatusCode::kInvalidArgument, "mem: keys (5, 4) and values (6, 3)"},
  };
  for (const Refusal& refusal : refusals) {
    const absl::Status status = load(refusal.upload);
    EXPECT_EQ(status.code(), refusal.code) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(refusal.message));
  }
  EXPECT_THAT(std::string(load(good, true, "masked_softmax").message()),
              HasSubstr("'masked_softmax' is built in"));
  // Nothing was written anywhere, and the first upload still serves.
  EXPECT_EQ(catalogue.Resolve("mem", "")->stored->tensors.at("keys").data[0],
            1.0f);
  EXPECT_EQ(on_disk(), saved);
  EXPECT_FALSE(std::ifstream(dir_ + "/mem2/weights.safetensors").good());
  EXPECT_FALSE(std::ifstream(dir_ + "/mem/1/weights.safetensors").good());
  // An unload takes no upload.
  EXPECT_THAT(std::string(catalogue.Unload(true, "mem", {"config"}).message()),
              HasSubstr("parameter 'config': not supported"));

  // A second upload replaces the first, whole.
  ASSERT_TRUE(load(upload(config, {{"file:weights.safetensors", other}})).ok());
  EXPECT_EQ(catalogue.Resolve("mem", "")->stored->tensors.at("keys").data[0],
            2.0f);
}

// --max_model_bytes bounds what a model's file may hold, uploaded, saved or
// read from disk, before it is read or written.
TEST_F(ModelCatalogueTest, ModelBytesAreBounded) {
  ModelRepository::Options options;
  options.dir = dir_;
  options.max_model_bytes = 64;
  std::unique_ptr<ModelRepository> small = LoadModelRepository(options).value();
  ModelCatalogue catalogue(small.get(), ModelControl{/*explicit_mode=*/true, /*needs_permission=*/false,
                                        /*on_event=*/{}});
  std::map<std::string, attn::Tensor> tensors;
  tensors["keys"] = attn::Tensor::Zeros({8, 4});
  tensors["values"] = attn::Tensor::Zeros({8, 4});
  const std::string bytes = SerializeSafetensors(tensors);
  const absl::Status uploaded = catalogue.Load(
      true, "big", {"config", "file:weights.safetensors"},
      ModelUpload{R"({"backend": "attention_memory"})",
                  {{"file:weights.safetensors", bytes}}});
  EXPECT_EQ(uploaded.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(uploaded.message()),
              HasSubstr("over the limit of 64 (--max_model_bytes)"));
  const float x[] = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f};
  const absl::Status saved = catalogue.SaveFittedModel(
      "fit", 1.0f, attn::TensorView{x, {8}}, attn::TensorView{x, {8}});
  EXPECT_EQ(saved.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(saved.message()), HasSubstr("--max_model_bytes"));
  EXPECT_TRUE(small->Names().empty());

  // On disk: the big folder is refused when loaded, naming its file.
  RepositoryModel memory;
  memory.config.set_name("big");
  memory.config.set_backend("attention_memory");
  for (auto& [name, tensor] : tensors) memory.tensors[name] = tensor;
  ASSERT_TRUE(
      repository_->SaveModel({"test", "a memory"}, "big", std::move(memory)).ok());
  const absl::Status read = catalogue.Load(true, "big", {});
  EXPECT_EQ(read.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(read.message()),
              HasSubstr("big/weights.safetensors: "));
  EXPECT_EQ(small->Find("big"), nullptr);
}

// A served memory's file truncated, or rewritten in place, on disk (an
// operator's mistake, a shared volume): the version served keeps its
// values (nothing served reads the file after the load), a reload of the
// truncated file is refused naming it while the old version serves on, and
// only a reload of a whole file changes what is served. The version is
// served from the file's mapping, which the lease keeper copies before the
// file may change (server/repository/mapped_file.h).
TEST_F(ModelCatalogueTest, AServedMemoryOutlivesItsFileChangedInPlace) {
  auto memory = [](float value) {
    RepositoryModel model;
    model.config.set_name("mem");
    model.config.set_backend(AttentionMemoryKind().backend);
    for (auto [name, shape] : {std::pair<const char*, attn::Shape>{"keys", {64, 8}},
                               {"values", {64, 4}}}) {
      attn::Tensor tensor = attn::Tensor::Zeros(shape);
      std::fill(tensor.data.begin(), tensor.data.end(), value);
      model.tensors[name] = std::move(tensor);
    }
    return model;
  };
  ASSERT_TRUE(
      repository_->SaveModel({"test", "a memory"}, "mem", memory(1.0f)).ok());
  ModelCatalogue catalogue(repository_.get(),
                           ModelControl{/*explicit_mode=*/true, /*needs_permission=*/false,
                                        /*on_event=*/{}});
  const std::shared_ptr<const RepositoryModel> held =
      catalogue.Resolve("mem", "")->stored;
  // Served from the file's mapping: a truncation would raise SIGBUS in the
  // reads below, and a rewrite change the values, unless guarded.
  ASSERT_TRUE(held->weights_mapped);
  const std::string path = dir_ + "/mem/weights.safetensors";
  auto all_equal = [](const RepositoryModel& model, float value) {
    for (const auto& [name, tensor] : model.tensors) {
      for (float x : tensor.values()) {
        if (x != value) return false;
      }
    }
    return true;
  };

  std::ifstream in(path, std::ios::binary);
  const std::string whole((std::istreambuf_iterator<char>(in)), {});
  in.close();
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(whole.size() / 2)), 0);
  EXPECT_TRUE(all_equal(*held, 1.0f));
  const absl::Status reload = catalogue.Load(true, "mem", {});
  EXPECT_EQ(reload.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(reload.message()),
              HasSubstr("mem/weights.safetensors"));
  EXPECT_EQ(catalogue.Resolve("mem", "")->stored, held);

  // Rewritten in place, the same size, other values: served unchanged
  // until a reload.
  const std::string other = SerializeSafetensors(memory(2.0f).tensors);
  ASSERT_EQ(other.size(), whole.size());
  {
    std::fstream out(path, std::ios::binary | std::ios::in | std::ios::out);
    out.write(other.data(), static_cast<std::streamsize>(other.size()));
  }
  EXPECT_TRUE(all_equal(*catalogue.Resolve("mem", "")->stored, 1.0f));
  ASSERT_TRUE(catalogue.Load(true, "mem", {}).ok());
  EXPECT_TRUE(all_equal(*catalogue.Resolve("mem", "")->stored, 2.0f));
  EXPECT_TRUE(all_equal(*held, 1.0f));
}

// A stored memory's calls name its version's held memory (so a GPU keeps
// one copy of it between calls), and a replaced or unloaded version lets go
// of it only once the last call holding the version ends: the device copy
// goes with it (attn/held_memory.h; lib/attn/internal/residency_test.cc and
// the GPU tests prove that part).
TEST_F(ModelCatalogueTest, AGoneMemoryLetsGoOfItsHeldCopyWhenItsLastCallEnds) {
  auto memory = [] {
    RepositoryModel model;
    model.config.set_name("mem");
    model.config.set_backend(AttentionMemoryKind().backend);
    model.tensors["keys"] = attn::Tensor::Zeros({16, 4});
    model.tensors["values"] = attn::Tensor::Zeros({16, 2});
    return model;
  };
  ASSERT_TRUE(repository_->SaveModel({"test", "a memory"}, "mem", memory()).ok());
  ModelCatalogue catalogue(repository_.get(),
                           ModelControl{/*explicit_mode=*/true,
                                        /*needs_permission=*/false,
                                        /*on_event=*/{}});
  const float query[4] = {1, 2, 3, 4};
  ModelInputs inputs;
  inputs.floats["queries"] = attn::TensorView{query, {1, 1, 4}};
  auto held_of_a_call = [&](const ServedModel& served) {
    absl::StatusOr<OperationRequest> request =
        served.kind->build_request(KindArguments{
            "mem", {}, inputs, served.stored.get(), /*return_weights=*/false});
    EXPECT_TRUE(request.ok()) << request.status();
    const auto& stored = std::get<StoredRequest>(*request);
    return std::get<attn::AttentionRequest>(stored.request).held;
  };

  // A call in flight holds the version it resolved.
  std::shared_ptr<const RepositoryModel> first =
      catalogue.Resolve("mem", "")->stored;
  ASSERT_NE(first->held_memory, nullptr);
  EXPECT_EQ(first->held_memory->label(), "mem");
  EXPECT_EQ(held_of_a_call(*catalogue.Resolve("mem", "")),
            first->held_memory.get());
  std::weak_ptr<const attn::HeldMemory> first_held = first->held_memory;

  ASSERT_TRUE(catalogue.Load(true, "mem", {}).ok());  // replaced
  std::shared_ptr<const RepositoryModel> second =
      catalogue.Resolve("mem", "")->stored;
  EXPECT_NE(second->held_memory, first->held_memory);
  EXPECT_EQ(held_of_a_call(*catalogue.Resolve("mem", "")),
            second->held_memory.get());
  EXPECT_FALSE(first_held.expired()) << "let go under a call in flight";
  first.reset();  // the last call on the replaced version ends
  EXPECT_TRUE(first_held.expired());

  std::weak_ptr<const attn::HeldMemory> second_held = second->held_memory;
  ASSERT_TRUE(catalogue.Unload(true, "mem", {}).ok());
  EXPECT_FALSE(second_held.expired()) << "let go under a call in flight";
  second.reset();
  EXPECT_TRUE(second_held.expired());
}

TEST_F(ModelCatalogueTest, ModelControlAndTheIndex) {
  ModelCatalogue off(repository_.get());
  EXPECT_EQ(off.Load(true, "m", {}).code(),
            absl::StatusCode::kFailedPrecondition);
  ModelCatalogue catalogue(repository_.get(),
                           ModelControl{/*explicit_mode=*/true, /*needs_permission=*/true,
                                        /*on_event=*/{}});
  EXPECT_EQ(catalogue.Load(false, "m", {}).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(catalogue.Load(true, "m", {"config"}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(catalogue.Load(true, "masked_softmax", {"unload_dependents"}).ok());
  EXPECT_EQ(catalogue.Unload(true, "masked_softmax", {}).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(SaveBandwidthOnly("fitted", 0.5f).ok());
  ASSERT_TRUE(catalogue.Unload(true, "fitted", {}).ok());
  EXPECT_EQ(catalogue.Resolve("fitted", "").status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(catalogue.Load(true, "fitted", {}).ok());
  EXPECT_TRUE(catalogue.Resolve("fitted", "").ok());

  EXPECT_EQ(catalogue.Index(/*server_ready=*/true, /*ready_only=*/true).size(),
            5u);
  for (const ModelRepository::ModelState& model :
       catalogue.Index(/*server_ready=*/false, /*ready_only=*/false)) {
    EXPECT_EQ(model.state, "UNAVAILABLE") << model.name;
    EXPECT_EQ(model.reason, "the server is draining") << model.name;
  }
  EXPECT_TRUE(catalogue.Index(false, /*ready_only=*/true).empty());
}

}  // namespace
}  // namespace attnserve
