// Writes the seed corpora of the fuzz targets from real requests and model
// files (fuzz/README.md, "Seeds"):
//   corpus/typed_request/    one byte (the RPC) + a serialized attention.v1
//                            request: the README's examples and the chapter's
//                            toy cases, both encodings, every RPC and option
//   corpus/kserve_infer/     serialized inference.ModelInferRequest, one or
//                            more per served model, raw and typed contents
//   corpus/safetensors/      deploy/models/*/weights.safetensors and a few
//                            files written by SerializeSafetensors
//   corpus/model_repository/ each deploy/models folder as the target's input
//                            (config.pbtxt, separator, weights.safetensors)
// (corpus/validate/ is not generated here: its inputs are FuzzedDataProvider
// bytes; see the README.)
//
// Every request seed is first served in process and must be accepted (a
// refused seed aborts the generator), and every safetensors seed must parse.
//
// Usage: fuzz_seed_generator <repository root>. Deterministic: the same
// files every run. Files of the same name are overwritten; others are left.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "attention/v1/attention.pb.h"
#include "fuzz/common/check.h"
#include "fuzz/common/service_harness.h"
#include "inference/grpc_service.pb.h"
#include "server/models/model_catalogue.h"
#include "server/repository/model_repository.h"

namespace v1 = ::attention::v1;

namespace {

std::string root;

std::string ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    std::fprintf(stderr, "seed_generator: cannot read %s\n", path.c_str());
    std::exit(1);
  }
  std::ostringstream bytes;
  bytes << file.rdbuf();
  return bytes.str();
}

void Write(const std::string& target, const std::string& name,
           const std::string& bytes) {
  const std::string dir = root + "/fuzz/corpus/" + target;
  mkdir((root + "/fuzz/corpus").c_str(), 0755);
  mkdir(dir.c_str(), 0755);
  attn_fuzz::WriteFileOrDie(dir + "/" + name, bytes);
}

// Deterministic finite values in [-2, 2).
std::vector<float> Values(int64_t count, int seed) {
  std::vector<float> values(count);
  for (int64_t i = 0; i < count; ++i) {
    values[i] = static_cast<float>(((i + 1) * (seed + 7) * 37) % 64 - 32) / 16.0f;
  }
  return values;
}

int64_t Count(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

void Fill(v1::Tensor* tensor, const std::vector<int64_t>& shape, bool raw,
          int seed) {
  tensor->mutable_shape()->Assign(shape.begin(), shape.end());
  const std::vector<float> values = Values(Count(shape), seed);
  if (raw) {
    tensor->set_raw(reinterpret_cast<const char*>(values.data()),
                    4 * values.size());
  } else {
    tensor->mutable_values()->Assign(values.begin(), values.end());
  }
}

void Lengths(v1::Lengths* lengths, const std::vector<int64_t>& shape,
             const std::vector<int32_t>& values) {
  lengths->mutable_shape()->Assign(shape.begin(), shape.end());
  lengths->mutable_values()->Assign(values.begin(), values.end());
}

// Serves a seed request in process (fuzz/common/service_harness.h): every
// seed must be one the server accepts, so that fuzzing starts from inside.
void MustServe(const std::string& name,
               const std::function<grpc::ServerUnaryReactor*(
                   attn_fuzz::ServiceHarness&, grpc::CallbackServerContext*)>&
                   call) {
  attn_fuzz::ServiceHarness& harness = attn_fuzz::ServiceHarness::Get();
  const grpc::Status status = harness.Call(
      [&](grpc::CallbackServerContext* context) { return call(harness, context); });
  FUZZ_CHECK(status.ok(), "seed %s is refused: %s", name.c_str(),
             status.error_message().c_str());
}

template <typename Request, typename Response>
void Typed(int operation, const std::string& name, const Request& request,
           grpc::ServerUnaryReactor* (attnserve::AttentionService::*method)(
               grpc::CallbackServerContext*, const Request*, Response*)) {
  Response response;  // outlives the call: the worker fills it
  MustServe(name, [&](attn_fuzz::ServiceHarness& harness,
                      grpc::CallbackServerContext* context) {
    return (harness.typed().*method)(context, &request, &response);
  });
  Write("typed_request", name,
        std::string(1, static_cast<char>(operation)) + request.SerializeAsString());
}

void TypedSeeds() {
  for (bool raw : {false, true}) {
    const std::string suffix = raw ? "_raw" : "";
    {  // attnctl masked-softmax --shape x=2x2x4 --valid_lens 2,3
      v1::MaskedSoftmaxRequest r;
      Fill(r.mutable_x(), {2, 2, 4}, raw, 1);
      Lengths(r.mutable_valid_lens(), {2}, {2, 3});
      if (raw) r.set_output_encoding(v1::TENSOR_ENCODING_RAW);
      Typed(0, "masked_softmax_readme" + suffix, r,
            &attnserve::AttentionService::MaskedSoftmax);
      Lengths(r.mutable_valid_lens(), {2, 2}, {0, 4, 1, 3});
      Typed(0, "masked_softmax_per_row" + suffix, r,
            &attnserve::AttentionService::MaskedSoftmax);
    }
    {  // batch_matmul (2, 3, 4) x (2, 4, 5)
      v1::BatchMatmulRequest r;
      Fill(r.mutable_a(), {2, 3, 4}, raw, 2);
      Fill(r.mutable_b(), {2, 4, 5}, raw, 3);
      if (raw) r.set_output_encoding(v1::TENSOR_ENCODING_RAW);
      Typed(1, "batch_matmul" + suffix, r,
            &attnserve::AttentionService::BatchMatmul);
      r.set_precision(raw ? v1::PRECISION_FLOAT16 : v1::PRECISION_BFLOAT16);
      Typed(1, "batch_matmul_reduced" + suffix, r,
            &attnserve::AttentionService::BatchMatmul);
    }
    {  // attnctl attention --shape queries=2x1x2,keys=2x10x2,values=2x10x4
       //   --valid_lens 2,6 --return_weights (the chapter's toy case)
      v1::AttentionRequest r;
      Fill(r.mutable_queries(), {2, 1, 2}, raw, 4);
      Fill(r.mutable_keys(), {2, 10, 2}, raw, 5);
      Fill(r.mutable_values(), {2, 10, 4}, raw, 6);
      Lengths(r.mutable_valid_lens(), {2}, {2, 6});
      r.set_return_weights(true);
      if (raw) r.set_output_encoding(v1::TENSOR_ENCODING_RAW);
      Typed(2, "attention_toy" + suffix, r,
            &attnserve::AttentionService::ScaledDotProductAttention);
      // Multi-head, causal, per-row lengths, Gaussian score, a scale.
      v1::AttentionRequest m;
      Fill(m.mutable_queries(), {1, 2, 3, 4}, raw, 7);
      Fill(m.mutable_keys(), {1, 2, 5, 4}, raw, 8);
      Fill(m.mutable_values(), {1, 2, 5, 3}, raw, 9);
      Lengths(m.mutable_valid_lens(), {1, 3}, {5, 0, 2});
      m.set_causal(true);
      m.set_score(v1::SCORE_GAUSSIAN);
      m.set_scale(0.5f);
      m.set_return_weights(true);
      m.set_precision(v1::PRECISION_BFLOAT16);
      if (raw) m.set_output_encoding(v1::TENSOR_ENCODING_RAW);
      Typed(2, "attention_multi_head" + suffix, m,
            &attnserve::AttentionService::ScaledDotProductAttention);
    }
    {  // Additive attention, the chapter's shapes: queries (2, 1, 20),
       // keys (2, 10, 2), values (2, 10, 4), 8 hidden units.
      v1::AdditiveAttentionRequest r;
      Fill(r.mutable_queries(), {2, 1, 20}, raw, 10);
      Fill(r.mutable_keys(), {2, 10, 2}, raw, 11);
      Fill(r.mutable_values(), {2, 10, 4}, raw, 12);
      Lengths(r.mutable_valid_lens(), {2}, {2, 6});
      r.set_return_weights(true);
      if (raw) r.set_output_encoding(v1::TENSOR_ENCODING_RAW);
      v1::AdditiveAttentionRequest inline_weights = r;
      Fill(inline_weights.mutable_weights()->mutable_w_q(), {8, 20}, raw, 13);
      Fill(inline_weights.mutable_weights()->mutable_w_k(), {8, 2}, raw, 14);
      Fill(inline_weights.mutable_weights()->mutable_w_v(), {8}, raw, 15);
      Typed(3, "additive_inline_weights" + suffix, inline_weights,
            &attnserve::AttentionService::AdditiveAttention);
      r.set_weights_name("additive_attention");
      Typed(3, "additive_weights_name" + suffix, r,
            &attnserve::AttentionService::AdditiveAttention);
    }
    {  // Nadaraya-Watson on the chapter's 1-D data, and a 2-D case.
      v1::NadarayaWatsonRequest r;
      Fill(r.mutable_x_train(), {50}, raw, 16);
      Fill(r.mutable_y_train(), {50}, raw, 17);
      Fill(r.mutable_x_query(), {10}, raw, 18);
      r.set_return_weights(true);
      if (raw) r.set_output_encoding(v1::TENSOR_ENCODING_RAW);
      Typed(4, "nadaraya_watson_1d" + suffix, r,
            &attnserve::AttentionService::NadarayaWatson);
      v1::NadarayaWatsonRequest m;
      Fill(m.mutable_x_train(), {6, 2}, raw, 19);
      Fill(m.mutable_y_train(), {6, 3}, raw, 20);
      Fill(m.mutable_x_query(), {4, 2}, raw, 21);
      m.set_kernel(v1::REGRESSION_KERNEL_EPANECHNIKOV);
      m.set_bandwidth(0.75f);
      Typed(4, "nadaraya_watson_2d" + suffix, m,
            &attnserve::AttentionService::NadarayaWatson);
    }
    {  // attnctl fit-bandwidth: the chapter's data without its noise,
       // x in [0, 5), y = 2 sin(x) + x^0.8; 5 epochs.
      v1::FitBandwidthRequest r;
      std::vector<float> x(50), y(50);
      for (int i = 0; i < 50; ++i) {
        x[i] = 0.1f * i;
        y[i] = static_cast<float>(2.0 * std::sin(x[i]) + std::pow(x[i], 0.8));
      }
      for (auto [tensor, values] : {std::make_pair(r.mutable_x_train(), &x),
                                    std::make_pair(r.mutable_y_train(), &y)}) {
        tensor->add_shape(50);
        if (raw) {
          tensor->set_raw(reinterpret_cast<const char*>(values->data()), 200);
        } else {
          tensor->mutable_values()->Assign(values->begin(), values->end());
        }
      }
      r.set_initial_bandwidth(1.0f);
      r.set_learning_rate(0.5f);
      r.set_epochs(5);
      Typed(5, "fit_bandwidth" + suffix, r,
            &attnserve::AttentionService::FitBandwidth);
      r.set_save_as("fitted_seed");
      Typed(5, "fit_bandwidth_save_as" + suffix, r,
            &attnserve::AttentionService::FitBandwidth);
    }
  }
}

using InferInput = inference::ModelInferRequest::InferInputTensor;

InferInput* Fp32Input(inference::ModelInferRequest* r, const std::string& name,
                      const std::vector<int64_t>& shape, bool raw, int seed) {
  InferInput* input = r->add_inputs();
  input->set_name(name);
  input->set_datatype("FP32");
  input->mutable_shape()->Assign(shape.begin(), shape.end());
  const std::vector<float> values = Values(Count(shape), seed);
  if (raw) {
    r->add_raw_input_contents(reinterpret_cast<const char*>(values.data()),
                              4 * values.size());
  } else {
    input->mutable_contents()->mutable_fp32_contents()->Assign(values.begin(),
                                                               values.end());
  }
  return input;
}

void LengthsInput(inference::ModelInferRequest* r,
                  const std::vector<int64_t>& shape,
                  const std::vector<int64_t>& values, bool raw, bool wide) {
  InferInput* input = r->add_inputs();
  input->set_name("valid_lens");
  input->set_datatype(wide ? "INT64" : "INT32");
  input->mutable_shape()->Assign(shape.begin(), shape.end());
  if (wide) {
    if (raw) {
      r->add_raw_input_contents(reinterpret_cast<const char*>(values.data()),
                                8 * values.size());
    } else {
      input->mutable_contents()->mutable_int64_contents()->Assign(
          values.begin(), values.end());
    }
  } else {
    const std::vector<int32_t> narrow(values.begin(), values.end());
    if (raw) {
      r->add_raw_input_contents(reinterpret_cast<const char*>(narrow.data()),
                                4 * narrow.size());
    } else {
      input->mutable_contents()->mutable_int_contents()->Assign(narrow.begin(),
                                                                narrow.end());
    }
  }
}

void Kserve(const std::string& name, const inference::ModelInferRequest& r) {
  inference::ModelInferResponse response;  // outlives the call
  MustServe(name, [&](attn_fuzz::ServiceHarness& harness,
                      grpc::CallbackServerContext* context) {
    return harness.kserve().ModelInfer(context, &r, &response);
  });
  Write("kserve_infer", name, r.SerializeAsString());
}

void KserveSeeds() {
  for (bool raw : {false, true}) {
    const std::string suffix = raw ? "_raw" : "_typed";
    {
      inference::ModelInferRequest r;
      r.set_model_name("masked_softmax");
      r.set_id("seed-1");
      Fp32Input(&r, "X", {2, 2, 4}, raw, 1);
      LengthsInput(&r, {2}, {2, 3}, raw, /*wide=*/false);
      Kserve("masked_softmax" + suffix, r);
    }
    {
      inference::ModelInferRequest r;
      r.set_model_name("batch_matmul");
      r.set_model_version("1");
      Fp32Input(&r, "X", {2, 3, 4}, raw, 2);
      Fp32Input(&r, "Y", {2, 4, 5}, raw, 3);
      r.add_outputs()->set_name("Z");
      Kserve("batch_matmul" + suffix, r);
    }
    {  // Triton's per-item lengths [B, 1], INT64, both outputs requested.
      inference::ModelInferRequest r;
      r.set_model_name("dot_product_attention");
      Fp32Input(&r, "queries", {2, 1, 2}, raw, 4);
      Fp32Input(&r, "keys", {2, 10, 2}, raw, 5);
      Fp32Input(&r, "values", {2, 10, 4}, raw, 6);
      LengthsInput(&r, {2, 1}, {2, 6}, raw, /*wide=*/true);
      r.add_outputs()->set_name("output");
      r.add_outputs()->set_name("attention_weights");
      Kserve("dot_product_attention" + suffix, r);
    }
    {
      inference::ModelInferRequest r;
      r.set_model_name("nadaraya_watson");
      Fp32Input(&r, "x_train", {50}, raw, 7);
      Fp32Input(&r, "y_train", {50}, raw, 8);
      Fp32Input(&r, "x_query", {10}, raw, 9);
      (*r.mutable_parameters())["kernel"].set_string_param("boxcar");
      (*r.mutable_parameters())["bandwidth"].set_double_param(2.0);
      r.add_outputs()->set_name("attention_weights");
      r.add_outputs()->set_name("y_pred");
      Kserve("nadaraya_watson" + suffix, r);
    }
    {  // The example repository's models.
      inference::ModelInferRequest r;
      r.set_model_name("additive_attention");
      Fp32Input(&r, "queries", {2, 1, 20}, raw, 10);
      Fp32Input(&r, "keys", {2, 10, 2}, raw, 11);
      Fp32Input(&r, "values", {2, 10, 4}, raw, 12);
      LengthsInput(&r, {2, 1}, {2, 6}, raw, /*wide=*/false);
      r.add_outputs()->set_name("attention_weights");
      Kserve("additive_attention" + suffix, r);
      inference::ModelInferRequest f;
      f.set_model_name("nadaraya_watson_fitted");
      Fp32Input(&f, "x_train", {50}, raw, 13);
      Fp32Input(&f, "y_train", {50}, raw, 14);
      Fp32Input(&f, "x_query", {10}, raw, 15);
      Kserve("nadaraya_watson_fitted" + suffix, f);
    }
  }
}

// A model_repository seed: folder `model` of a repository must load.
void Repository(const std::string& name, const std::string& model,
                const std::string& config, const std::string& weights) {
  const std::string dir = attn_fuzz::MakeTemporaryFolder("attn-fuzz-seed");
  FUZZ_CHECK(mkdir((dir + "/" + model).c_str(), 0700) == 0, "mkdir");
  attn_fuzz::WriteFileOrDie(dir + "/" + model + "/config.pbtxt", config);
  attn_fuzz::WriteFileOrDie(dir + "/" + model + "/weights.safetensors", weights);
  const auto loaded = attnserve::LoadModelRepository(dir);
  FUZZ_CHECK(loaded.ok(), "seed %s does not load: %s", name.c_str(),
             loaded.status().ToString().c_str());
  attn_fuzz::RemoveTree(dir);
  Write("model_repository", name,
        config + "\n--- weights.safetensors ---\n" + weights);
}

void RepositorySeeds() {
  for (const char* model : {"additive_attention", "nadaraya_watson_fitted"}) {
    const std::string folder = root + "/deploy/models/" + model;
    const std::string weights = ReadFile(folder + "/weights.safetensors");
    Write("safetensors", std::string(model) + ".safetensors", weights);
    Repository(model, model, ReadFile(folder + "/config.pbtxt"), weights);
  }
  // Three ranks, several tensors, and a one-element tensor.
  std::map<std::string, attn::Tensor> tensors;
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{2, 3, 4}, {5}, {1}}) {
    attn::Tensor t = attn::Tensor::Zeros(shape);
    const std::vector<float> values = Values(Count(shape), 30);
    std::copy(values.begin(), values.end(), t.data.begin());
    tensors["t" + std::to_string(shape.size()) + "_" +
            std::to_string(Count(shape))] = std::move(t);
  }
  Write("safetensors", "serialized_three_tensors.safetensors",
        attnserve::SerializeSafetensors(tensors));
  FUZZ_CHECK(attnserve::ParseSafetensors(attnserve::SerializeSafetensors(tensors)).ok(),
             "serialized seed does not parse");
  // A file as Python's safetensors writes it: a __metadata__ entry.
  const std::string header =
      "{\"__metadata__\":{\"format\":\"pt\"},\"bandwidth\":{\"dtype\":\"F32\","
      "\"shape\":[1],\"data_offsets\":[0,4]}}";
  std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  uint64_t size = padded.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &size, 8);
  const float bandwidth = 2.5f;
  bytes += padded + std::string(reinterpret_cast<const char*>(&bandwidth), 4);
  FUZZ_CHECK(attnserve::ParseSafetensors(bytes).ok(),
             "metadata seed does not parse");
  Write("safetensors", "metadata.safetensors", bytes);
  Repository("nadaraya_watson_metadata", "fitted",
             "name: \"fitted\"\nplatform: \"attnserve\"\n"
             "backend: \"nadaraya_watson\"\nmax_batch_size: 0\n",
             bytes);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <repository root>\n", argv[0]);
    return 2;
  }
  root = argv[1];
  TypedSeeds();
  KserveSeeds();
  RepositorySeeds();
  return 0;
}
