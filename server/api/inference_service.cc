#include "server/api/inference_service.h"

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attn/status_macros.h"
#include "server/api/auth.h"
#include "server/api/kserve_request.h"
#include "server/api/status.h"
#include "server/api/tensor_codec.h"
#include "server/api/unary_call.h"

namespace attnserve {
namespace {

constexpr char kVersion[] = "1";

// Finishes a call that needs no kernel.
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                 const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

InferenceService::ModelSpec AdditiveSpec(const std::string& name) {
  return {name,
          Rpc::kAdditiveAttention,
          {{"queries", "FP32", {-1, -1, -1}},
           {"keys", "FP32", {-1, -1, -1}},
           {"values", "FP32", {-1, -1, -1}},
           {"valid_lens", "INT32", {-1, -1}, true}},
          {{"output", "FP32", {-1, -1, -1}},
           {"attention_weights", "FP32", {-1, -1, -1}}},
          {"output"}};
}

// The decoded inputs of one ModelInfer call, by name.
struct Inputs {
  DecodeStorage storage;  // copies the views may point into
  std::map<std::string, attn::TensorView> floats;
  std::map<std::string, attn::LengthsView> lengths;
  std::deque<std::vector<int32_t>> owned_lengths;
};

// Fills `inputs` in place: its views point into its own storage.
absl::Status DecodeInputs(const inference::ModelInferRequest& request,
                          const InferenceService::ModelSpec& model,
                          ElementBudget* budget, DecodeStorage* storage,
                          Inputs* out) {
  // CheckInferRequestStructure has run: each input is the model's, once,
  // and raw contents are one per input.
  Inputs& inputs = *out;
  const bool raw = request.raw_input_contents_size() > 0;
  for (int i = 0; i < request.inputs_size(); ++i) {
    const auto& input = request.inputs(i);
    const std::string field = absl::StrCat("input '", input.name(), "'");
    const InferenceService::TensorSpec* spec = nullptr;
    for (const auto& candidate : model.inputs) {
      if (candidate.name == input.name()) spec = &candidate;
    }
    if (spec == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": model '", model.name, "' has no such input"));
    }
    const attn::Shape shape(input.shape().begin(), input.shape().end());
    if (spec->datatype == "FP32") {
      if (input.datatype() != "FP32") {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": datatype must be FP32, got '", input.datatype(), "'"));
      }
      absl::StatusOr<attn::TensorView> view =
          raw ? DecodeRawFloats(field, shape, request.raw_input_contents(i),
                                budget, storage)
              : DecodeFloatValues(field, shape,
                                  input.contents().fp32_contents().data(),
                                  input.contents().fp32_contents_size(),
                                  budget);
      if (!view.ok()) return view.status();
      inputs.floats[input.name()] = *std::move(view);
      continue;
    }
    // Valid lengths: INT32 or INT64, raw or typed. A scalar would read as
    // "no valid lengths" downstream (an empty shape), silently unmasked.
    if (shape.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": shape [] is a scalar; valid lengths need shape [B], "
          "[B, 1] (one per batch entry) or [B, Q] (one per query)"));
    }
    ASSIGN_OR_RETURN(const int64_t count, attn::CheckedNumElements(field, shape));
    RETURN_IF_ERROR(budget->Take(field, count));
    std::vector<int32_t>& values = inputs.owned_lengths.emplace_back();
    if (input.datatype() == "INT32") {
      if (raw) {
        const std::string& bytes = request.raw_input_contents(i);
        if (static_cast<int64_t>(bytes.size()) != 4 * count) {
          return absl::InvalidArgumentError(absl::StrCat(
              field, ": shape ", attn::ShapeToString(shape), " needs ",
              4 * count, " raw bytes (INT32), got ", bytes.size()));
        }
        values.resize(count);
        std::memcpy(values.data(), bytes.data(), bytes.size());
      } else {
        values.assign(input.contents().int_contents().begin(),
                      input.contents().int_contents().end());
      }
    } else if (input.datatype() == "INT64") {
      std::vector<int64_t> wide;
      if (raw) {
        const std::string& bytes = request.raw_input_contents(i);
        if (static_cast<int64_t>(bytes.size()) != 8 * count) {
          return absl::InvalidArgumentError(absl::StrCat(
              field, ": shape ", attn::ShapeToString(shape), " needs ",
              8 * count, " raw bytes (INT64), got ", bytes.size()));
        }
        wide.resize(count);
        std::memcpy(wide.data(), bytes.data(), bytes.size());
      } else {
        wide.assign(input.contents().int64_contents().begin(),
                    input.contents().int64_contents().end());
      }
      for (int64_t value : wide) {
        // Out-of-range values are caught by the length check downstream.
        values.push_back(static_cast<int32_t>(
            std::max<int64_t>(std::min<int64_t>(value, INT32_MAX), -1)));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": datatype must be INT32 or INT64, got '", input.datatype(),
          "'"));
    }
    if (static_cast<int64_t>(values.size()) != count) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": shape ", attn::ShapeToString(shape), " needs ", count,
          " values, got ", values.size()));
    }
    attn::Shape lengths_shape = shape;
    // Triton's per-batch-item scalars arrive as [B, 1]: one length per
    // batch entry, whatever Lq is.
    if (lengths_shape.size() == 2 && lengths_shape[1] == 1) {
      lengths_shape.pop_back();
    }
    inputs.lengths[input.name()] =
        attn::LengthsView{values.data(), std::move(lengths_shape)};
  }
  for (const auto& spec : model.inputs) {
    if (!spec.optional && !inputs.floats.count(spec.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", spec.name, "': required by model '", model.name,
          "' but not given"));
    }
  }
  return absl::OkStatus();
}

// The outputs to return, in order: those requested (checked by
// CheckInferRequestStructure: the model's, each once), else the defaults.
std::vector<std::string> RequestedOutputs(
    const inference::ModelInferRequest& request,
    const InferenceService::ModelSpec& model) {
  std::vector<std::string> names;
  for (const auto& output : request.outputs()) names.push_back(output.name());
  if (names.empty()) names = model.default_outputs;
  return names;
}

ModelTensorNames TensorNamesOf(const InferenceService::ModelSpec& model) {
  ModelTensorNames names{model.name, {}, {}};
  for (const auto& input : model.inputs) names.inputs.push_back(input.name);
  for (const auto& output : model.outputs) names.outputs.push_back(output.name);
  return names;
}

bool Wants(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

void AddOutput(const std::string& name, const attn::Tensor& tensor,
               inference::ModelInferResponse* response) {
  auto* output = response->add_outputs();
  output->set_name(name);
  output->set_datatype("FP32");
  output->mutable_shape()->Assign(tensor.shape.begin(), tensor.shape.end());
  response->add_raw_output_contents(
      reinterpret_cast<const char*>(tensor.data.data()),
      tensor.data.size() * sizeof(float));
}

// Fills the response's outputs in the requested order from named tensors.
void Respond(const inference::ModelInferRequest& request,
             const std::vector<std::string>& names,
             const std::map<std::string, const attn::Tensor*>& tensors,
             inference::ModelInferResponse* response) {
  response->set_model_name(request.model_name());
  response->set_model_version(kVersion);
  response->set_id(request.id());
  for (const std::string& name : names) AddOutput(name, *tensors.at(name), response);
}

// The library names some arguments differently from the models' inputs
// (masked_softmax's x is X; batch_matmul's a and b are X and Y): say the
// input's name in errors.
absl::Status WithInputNames(const std::string& model, absl::Status status) {
  static const auto* const renames =
      new std::map<std::string, std::vector<std::pair<std::string, std::string>>>{
          {"masked_softmax", {{"x:", "X"}}},
          {"batch_matmul", {{"a:", "X"}, {"b:", "Y"}}}};
  auto it = renames->find(model);
  if (status.ok() || it == renames->end()) return status;
  for (const auto& [prefix, input] : it->second) {
    if (absl::StartsWith(status.message(), prefix)) {
      return absl::Status(
          status.code(),
          absl::StrCat("input '", input, "'",
                       status.message().substr(prefix.size() - 1)));
    }
  }
  return status;
}

absl::StatusOr<attn::RegressionKernel> KernelParameter(
    const inference::ModelInferRequest& request) {
  auto it = request.parameters().find("kernel");
  if (it == request.parameters().end()) return attn::RegressionKernel::kGaussian;
  const std::string& kernel = it->second.string_param();
  if (kernel == "gaussian") return attn::RegressionKernel::kGaussian;
  if (kernel == "boxcar") return attn::RegressionKernel::kBoxcar;
  if (kernel == "constant") return attn::RegressionKernel::kConstant;
  if (kernel == "epanechnikov") return attn::RegressionKernel::kEpanechnikov;
  return absl::InvalidArgumentError(absl::StrCat(
      "parameter 'kernel': '", kernel,
      "' is not one of gaussian, boxcar, constant, epanechnikov"));
}

absl::StatusOr<float> BandwidthParameter(
    const inference::ModelInferRequest& request) {
  auto it = request.parameters().find("bandwidth");
  if (it == request.parameters().end()) return 1.0f;
  switch (it->second.parameter_choice_case()) {
    case inference::InferParameter::kDoubleParam:
      return static_cast<float>(it->second.double_param());
    case inference::InferParameter::kInt64Param:
      return static_cast<float>(it->second.int64_param());
    default:
      return absl::InvalidArgumentError(
          "parameter 'bandwidth': must be a number (double_param)");
  }
}

// Triton's request parameters "priority" (uint64; 1 the highest, 0 none) and
// "timeout" (microseconds), into the call's context.
absl::Status ApplyPriorityAndTimeout(const inference::ModelInferRequest& request,
                                     CallContext* context) {
  for (const char* name : {"priority", "timeout"}) {
    auto it = request.parameters().find(name);
    if (it == request.parameters().end()) continue;
    int64_t value = -1;
    switch (it->second.parameter_choice_case()) {
      case inference::InferParameter::kInt64Param:
        value = it->second.int64_param();
        break;
      case inference::InferParameter::kUint64Param:
        value = static_cast<int64_t>(
            std::min<uint64_t>(it->second.uint64_param(), uint64_t{1} << 62));
        break;
      default:
        break;
    }
    if (value < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", name,
          "': must be a non-negative integer (int64_param or uint64_param)"));
    }
    if (std::string(name) == "priority") {
      context->priority = static_cast<uint64_t>(value);
    } else {
      ApplyTimeout(value, context);
    }
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<InferenceService::ModelSpec>& InferenceService::Models() {
  static const auto* const models = new std::vector<ModelSpec>{
      {"masked_softmax",
       Rpc::kMaskedSoftmax,
       {{"X", "FP32", {-1, -1, -1}}, {"valid_lens", "INT32", {-1}, true}},
       {{"Y", "FP32", {-1, -1, -1}}},
       {"Y"}},
      {"batch_matmul",
       Rpc::kBatchMatmul,
       {{"X", "FP32", {-1, -1, -1}}, {"Y", "FP32", {-1, -1, -1}}},
       {{"Z", "FP32", {-1, -1, -1}}},
       {"Z"}},
      {"dot_product_attention",
       Rpc::kScaledDotProductAttention,
       {{"queries", "FP32", {-1, -1, -1}},
        {"keys", "FP32", {-1, -1, -1}},
        {"values", "FP32", {-1, -1, -1}},
        // [B], [B, Lq], or Triton's per-item form [B, 1] (batch dim first).
        {"valid_lens", "INT32", {-1, -1}, true}},
       {{"output", "FP32", {-1, -1, -1}},
        {"attention_weights", "FP32", {-1, -1, -1}}},
       {"output"}},
      {"nadaraya_watson",
       Rpc::kNadarayaWatson,
       {{"x_train", "FP32", {-1}},
        {"y_train", "FP32", {-1}},
        {"x_query", "FP32", {-1}}},
       {{"y_pred", "FP32", {-1}}, {"attention_weights", "FP32", {-1, -1}}},
       {"y_pred"}},
  };
  return *models;
}

InferenceService::InferenceService(CallRunner* calls,
                                   ModelRepository* repository,
                                   const BatchingOptions* batching,
                                   int max_batch_size,
                                   const ModelControl& model_control)
    : calls_(calls),
      repository_(repository),
      batching_(batching != nullptr),
      batching_options_(batching != nullptr ? *batching : BatchingOptions{}),
      max_batch_size_(max_batch_size),
      model_control_(model_control) {}

std::vector<std::string> InferenceService::ModelNames() const {
  std::vector<std::string> names;
  for (const ModelSpec& model : Models()) names.push_back(model.name);
  if (repository_ != nullptr) {
    for (const std::string& name : repository_->Names()) {
      names.push_back(name);
    }
  }
  return names;
}

InferenceService::ModelSpec InferenceService::RepositorySpec(
    const std::string& name, const RepositoryModel& model) {
  if (model.config.backend() == "additive_attention") return AdditiveSpec(name);
  // A fitted bandwidth: the built-in nadaraya_watson's tensors.
  ModelSpec spec;
  for (const ModelSpec& built_in : Models()) {
    if (built_in.rpc == Rpc::kNadarayaWatson) spec = built_in;
  }
  spec.name = name;
  return spec;
}

absl::StatusOr<InferenceService::Resolved> InferenceService::Resolve(
    const std::string& name, const std::string& version) const {
  Resolved resolved;
  bool found = false;
  for (const ModelSpec& model : Models()) {
    if (model.name == name) {
      resolved.spec = model;
      found = true;
    }
  }
  if (!found && repository_ != nullptr) {
    resolved.held = repository_->Find(name);
    if (resolved.held != nullptr) {
      found = true;
      resolved.spec = RepositorySpec(name, *resolved.held);
    }
  }
  if (!found) {
    return absl::NotFoundError(absl::StrCat("model '", name,
                                            "' is not served; served: ",
                                            absl::StrJoin(ModelNames(), ", ")));
  }
  if (!version.empty() && version != kVersion) {
    return absl::NotFoundError(absl::StrCat("model '", name, "' version '",
                                            version, "' is not served; served: 1"));
  }
  return resolved;
}

grpc::ServerUnaryReactor* InferenceService::ServerLive(
    grpc::CallbackServerContext* context, const inference::ServerLiveRequest*,
    inference::ServerLiveResponse* response) {
  response->set_live(true);
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ServerReady(
    grpc::CallbackServerContext* context, const inference::ServerReadyRequest*,
    inference::ServerReadyResponse* response) {
  response->set_ready(ready_.load());
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelReady(
    grpc::CallbackServerContext* context,
    const inference::ModelReadyRequest* request,
    inference::ModelReadyResponse* response) {
  response->set_ready(ready_.load() &&
                      Resolve(request->name(), request->version()).ok());
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ServerMetadata(
    grpc::CallbackServerContext* context, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  response->set_name("attnserve");
  response->set_version("0.1.0");
  response->add_extensions("model_configuration");
  response->add_extensions("statistics");
  // Triton's names: the repository index, load and unload; priorities and
  // timeouts. ModelStreamInfer has no extension name in Triton; ours is
  // the RPC's.
  response->add_extensions("model_repository");
  response->add_extensions("schedule_policy");
  response->add_extensions("model_stream_infer");
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelMetadata(
    grpc::CallbackServerContext* context,
    const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  absl::StatusOr<Resolved> resolved = Resolve(request->name(), request->version());
  if (!resolved.ok()) return Answer(context, resolved.status());
  const ModelSpec* model = &resolved->spec;
  response->set_name(model->name);
  response->add_versions(kVersion);
  response->set_platform("attnserve");
  for (const TensorSpec& spec : model->inputs) {
    auto* input = response->add_inputs();
    input->set_name(spec.name);
    input->set_datatype(spec.datatype);
    input->mutable_shape()->Assign(spec.shape.begin(), spec.shape.end());
  }
  for (const TensorSpec& spec : model->outputs) {
    auto* output = response->add_outputs();
    output->set_name(spec.name);
    output->set_datatype(spec.datatype);
    output->mutable_shape()->Assign(spec.shape.begin(), spec.shape.end());
  }
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelConfig(
    grpc::CallbackServerContext* context,
    const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  absl::StatusOr<Resolved> resolved = Resolve(request->name(), request->version());
  if (!resolved.ok()) return Answer(context, resolved.status());
  const ModelSpec* model = &resolved->spec;
  inference::ModelConfig* config = response->mutable_config();
  if (resolved->held != nullptr) *config = resolved->held->config;
  config->set_name(model->name);
  config->set_platform("attnserve");
  if (resolved->held == nullptr) config->set_backend("attnserve");
  config->clear_input();
  config->clear_output();
  // dot_product_attention's first dimension is a batch dimension (left out
  // of the config's dims); it goes through the dynamic batcher when the
  // server batches.
  const bool batched = model->rpc == Rpc::kScaledDotProductAttention;
  config->set_max_batch_size(batched ? max_batch_size_ : 0);
  auto dims = [batched](const TensorSpec& spec) {
    return std::vector<int64_t>(spec.shape.begin() + (batched ? 1 : 0),
                                spec.shape.end());
  };
  for (const TensorSpec& spec : model->inputs) {
    auto* input = config->add_input();
    input->set_name(spec.name);
    input->set_data_type(spec.datatype == "FP32" ? inference::TYPE_FP32
                                                 : inference::TYPE_INT32);
    const std::vector<int64_t> d = dims(spec);
    input->mutable_dims()->Assign(d.begin(), d.end());
    input->set_optional(spec.optional);
    input->set_allow_ragged_batch(batched);
  }
  for (const TensorSpec& spec : model->outputs) {
    auto* output = config->add_output();
    output->set_name(spec.name);
    output->set_data_type(inference::TYPE_FP32);
    const std::vector<int64_t> d = dims(spec);
    output->mutable_dims()->Assign(d.begin(), d.end());
  }
  if (batched && batching_) {
    inference::ModelDynamicBatching* dynamic = config->mutable_dynamic_batching();
    for (int size : batching_options_.preferred_batch_sizes) {
      dynamic->add_preferred_batch_size(size);
    }
    dynamic->set_max_queue_delay_microseconds(static_cast<uint64_t>(
        absl::ToInt64Microseconds(batching_options_.max_queue_delay)));
    dynamic->mutable_default_queue_policy()->set_max_queue_size(
        static_cast<uint32_t>(batching_options_.max_queue_size));
  }
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::RepositoryIndex(
    grpc::CallbackServerContext* context,
    const inference::RepositoryIndexRequest* request,
    inference::RepositoryIndexResponse* response) {
  const bool ready = ready_.load();
  auto add = [&](const std::string& name, const std::string& state,
                 const std::string& reason) {
    if (request->ready() && state != "READY") return;
    auto* index = response->add_models();
    index->set_name(name);
    index->set_version(kVersion);
    index->set_state(state);
    index->set_reason(reason);
  };
  for (const ModelSpec& model : Models()) {
    add(model.name, ready ? "READY" : "UNAVAILABLE",
        ready ? "" : "the server is draining");
  }
  if (repository_ != nullptr) {
    for (const ModelRepository::ModelState& model : repository_->Index()) {
      const bool serving = model.state == "READY";
      add(model.name, serving && !ready ? "UNAVAILABLE" : model.state,
          serving && !ready ? "the server is draining" : model.reason);
    }
  }
  return Answer(context, absl::OkStatus());
}

absl::Status InferenceService::CheckModelControl(
    grpc::CallbackServerContext* context, const std::string& model_name) const {
  if (!model_control_.explicit_mode) {
    return absl::FailedPreconditionError(
        "model control is off: start the server with "
        "--model_control_mode=explicit to load and unload models");
  }
  if (model_control_.needs_permission &&
      (context->auth_context() == nullptr ||
       context->auth_context()->FindPropertyValues(kModelControlProperty)
           .empty())) {
    return absl::PermissionDeniedError(
        "this token may not load or unload models; give it the permission "
        "model_control in --auth_tokens_file");
  }
  if (repository_ == nullptr) {
    return absl::FailedPreconditionError(
        "the server runs without --model_repository");
  }
  if (model_name.empty()) {
    return absl::InvalidArgumentError("model_name: empty");
  }
  return absl::OkStatus();
}

namespace {

// Parameters Triton's clients send that mean nothing here; others (a
// config override, model files) are refused rather than ignored.
absl::Status CheckControlParameters(
    const google::protobuf::Map<std::string, inference::ModelRepositoryParameter>&
        parameters) {
  for (const auto& [name, value] : parameters) {
    if (name == "unload_dependents") continue;  // no model depends on another
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter '", name,
        "': not supported; put the model's config.pbtxt and "
        "weights.safetensors in its repository folder and load it by name"));
  }
  return absl::OkStatus();
}

bool IsBuiltIn(const std::string& name) {
  for (const InferenceService::ModelSpec& model : InferenceService::Models()) {
    if (model.name == name) return true;
  }
  return false;
}

}  // namespace

grpc::ServerUnaryReactor* InferenceService::RepositoryModelLoad(
    grpc::CallbackServerContext* context,
    const inference::RepositoryModelLoadRequest* request,
    inference::RepositoryModelLoadResponse*) {
  absl::Status status = CheckModelControl(context, request->model_name());
  if (status.ok()) status = CheckControlParameters(request->parameters());
  if (status.ok() && !IsBuiltIn(request->model_name())) {
    status = repository_->LoadModel(request->model_name());
  }
  return Answer(context, status);
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelUnload(
    grpc::CallbackServerContext* context,
    const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse*) {
  absl::Status status = CheckModelControl(context, request->model_name());
  if (status.ok()) status = CheckControlParameters(request->parameters());
  if (status.ok() && IsBuiltIn(request->model_name())) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "model_name: '", request->model_name(),
        "' is built in and always served"));
  }
  if (status.ok()) status = repository_->UnloadModel(request->model_name());
  return Answer(context, status);
}

grpc::ServerUnaryReactor* InferenceService::ModelStatistics(
    grpc::CallbackServerContext* context,
    const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  std::vector<std::string> names;
  if (request->name().empty()) {
    names = ModelNames();
  } else {
    absl::StatusOr<Resolved> resolved =
        Resolve(request->name(), request->version());
    if (!resolved.ok()) return Answer(context, resolved.status());
    names.push_back(request->name());
  }
  for (const std::string& name : names) {
    const ModelStatistics::Counts stats = calls_->statistics().Get(name);
    auto* out = response->add_model_stats();
    out->set_name(name);
    out->set_version(kVersion);
    out->set_last_inference(stats.last_inference_ms);
    out->set_inference_count(stats.inferences);
    out->set_execution_count(static_cast<uint64_t>(std::llround(stats.executions)));
    auto* inference = out->mutable_inference_stats();
    inference->mutable_success()->set_count(stats.success_count);
    inference->mutable_success()->set_ns(stats.success_ns);
    inference->mutable_fail()->set_count(stats.fail_count);
    inference->mutable_fail()->set_ns(stats.fail_ns);
    inference->mutable_queue()->set_count(stats.queue_count);
    inference->mutable_queue()->set_ns(stats.queue_ns);
    inference->mutable_compute_infer()->set_count(stats.compute_count);
    inference->mutable_compute_infer()->set_ns(stats.compute_ns);
    inference->mutable_compute_input()->set_count(stats.compute_count);
    inference->mutable_compute_output()->set_count(stats.compute_count);
  }
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelInfer(
    grpc::CallbackServerContext* context,
    const inference::ModelInferRequest* request,
    inference::ModelInferResponse* response) {
  auto* reactor = new UnaryCallReactor(response, nullptr,
                                       calls_->limits().max_response_bytes);
  Infer(request, response, ContextOf(context), reactor);
  return reactor;
}

void InferenceService::Infer(const inference::ModelInferRequest* request,
                             inference::ModelInferResponse* response,
                             CallContext context, CallResponder* responder) {
  absl::StatusOr<Resolved> resolved =
      Resolve(request->model_name(), request->model_version());
  if (!resolved.ok()) {
    responder->Answer(resolved.status(), CallRecord{}, Admission::Ticket());
    return;
  }
  // Shared with the closures below: the spec and any repository weights must
  // outlive the kernel.
  auto held = std::make_shared<Resolved>(*std::move(resolved));
  const ModelSpec* model = &held->spec;
  if (absl::Status structure =
          CheckInferRequestStructure(*request, TensorNamesOf(*model));
      !structure.ok()) {
    responder->Answer(structure, CallRecord{}, Admission::Ticket());
    return;
  }
  const std::vector<std::string> names = RequestedOutputs(*request, *model);
  context.model = model->name;
  if (absl::Status status = ApplyPriorityAndTimeout(*request, &context);
      !status.ok()) {
    responder->Answer(status, CallRecord{}, Admission::Ticket());
    return;
  }
  // Decoded inputs must live until the kernel has run: the closures that run
  // it hold `inputs`.
  auto inputs = std::make_shared<Inputs>();
  auto decode = [request, model, inputs](ElementBudget* budget) -> absl::Status {
    return DecodeInputs(*request, *model, budget, &inputs->storage,
                        inputs.get());
  };
  auto lengths = [inputs]() {
    auto it = inputs->lengths.find("valid_lens");
    return it == inputs->lengths.end() ? attn::LengthsView{} : it->second;
  };

  // Every model but the fit is one batchable operation: decode it, hand it
  // to the core, and encode its outputs under the model's names.
  auto decode_op = [held, model, request, decode, inputs, lengths,
                    names](
                       ElementBudget* budget) -> absl::StatusOr<BatchableRequest> {
    RETURN_IF_ERROR(decode(budget));
    switch (model->rpc) {
      case Rpc::kMaskedSoftmax: {
        attn::MaskedSoftmaxRequest op;
        op.x = inputs->floats["X"];
        op.valid_lens = lengths();
        return op;
      }
      case Rpc::kBatchMatmul: {
        attn::BatchMatmulRequest op;
        op.a = inputs->floats["X"];
        op.b = inputs->floats["Y"];
        return op;
      }
      case Rpc::kScaledDotProductAttention: {
        attn::AttentionRequest op;
        op.queries = inputs->floats["queries"];
        op.keys = inputs->floats["keys"];
        op.values = inputs->floats["values"];
        op.valid_lens = lengths();
        op.return_weights = Wants(names, "attention_weights");
        return op;
      }
      case Rpc::kAdditiveAttention: {
        const auto& tensors = held->held->tensors;
        attn::AdditiveAttentionRequest op;
        op.queries = inputs->floats["queries"];
        op.keys = inputs->floats["keys"];
        op.values = inputs->floats["values"];
        op.valid_lens = lengths();
        op.w_q = tensors.at("W_q").view();
        op.w_k = tensors.at("W_k").view();
        op.w_v = tensors.at("w_v").view();
        op.return_weights = Wants(names, "attention_weights");
        return op;
      }
      default: {
        attn::NadarayaWatsonRequest op;
        op.x_train = inputs->floats["x_train"];
        op.y_train = inputs->floats["y_train"];
        op.x_query = inputs->floats["x_query"];
        ASSIGN_OR_RETURN(op.kernel, KernelParameter(*request));
        if (held->held != nullptr) {
          if (request->parameters().count("bandwidth")) {
            return absl::InvalidArgumentError(absl::StrCat(
                "parameter 'bandwidth': model '", model->name,
                "' serves its fitted bandwidth"));
          }
          op.bandwidth = held->held->tensors.at("bandwidth").data[0];
        } else {
          ASSIGN_OR_RETURN(op.bandwidth, BandwidthParameter(*request));
        }
        op.return_weights = Wants(names, "attention_weights");
        return op;
      }
    }
  };
  // Holds `inputs` and `held` until the kernel has run: the decoded views
  // and any repository weights live there.
  auto encode = [held, model, request, response, inputs,
                 names](const attn::OpResult& result) {
    switch (model->rpc) {
      case Rpc::kMaskedSoftmax:
        Respond(*request, names, {{"Y", &result.output}}, response);
        break;
      case Rpc::kBatchMatmul:
        Respond(*request, names, {{"Z", &result.output}}, response);
        break;
      case Rpc::kNadarayaWatson:
        Respond(*request, names,
                {{"y_pred", &result.output},
                 {"attention_weights", &result.weights}},
                response);
        break;
      default:
        Respond(*request, names,
                {{"output", &result.output},
                 {"attention_weights", &result.weights}},
                response);
    }
  };
  CallRunner::WireNames wire_names;
  if (model->rpc == Rpc::kMaskedSoftmax || model->rpc == Rpc::kBatchMatmul) {
    wire_names = [name = model->name](absl::Status status) {
      return WithInputNames(name, std::move(status));
    };
  }
  calls_->RunOp(model->rpc, context, decode_op, std::move(encode),
                std::move(wire_names), responder);
}

}  // namespace attnserve
