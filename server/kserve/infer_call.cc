#include "server/kserve/infer_call.h"

#include <algorithm>
#include <utility>

#include "attn/status_macros.h"
#include "server/kserve/parameters.h"
#include "server/kserve/request.h"

namespace attnserve {
namespace {

ModelTensorNames TensorNamesOf(const ModelSignature& model) {
  ModelTensorNames names{model.name, {}, {}};
  for (const auto& input : model.inputs) names.inputs.push_back(input.name);
  for (const auto& output : model.outputs) names.outputs.push_back(output.name);
  return names;
}

}  // namespace

void KServeInferCall::Start(const ModelCatalogue& catalogue, CallRunner* runner,
                            const inference::ModelInferRequest* request,
                            inference::ModelInferResponse* response,
                            CallContext context, CallResponder* responder) {
  absl::StatusOr<ServedModel> model =
      catalogue.Resolve(request->model_name(), request->model_version());
  if (!model.ok()) {
    runner->Refuse(std::nullopt, context, model.status(), responder);
    return;
  }
  const Operation operation = model->signature.operation;
  if (absl::Status structure =
          CheckInferRequestStructure(*request, TensorNamesOf(model->signature));
      !structure.ok()) {
    runner->Refuse(operation, context, structure, responder);
    return;
  }
  std::vector<std::string> outputs = RequestedOutputs(*request, model->signature);
  context.model = model->signature.name;
  context.gains_from_batching = model->kind->gains_from_batching;
  if (absl::Status status = ApplyPriorityAndTimeout(*request, &context);
      !status.ok()) {
    runner->Refuse(operation, context, status, responder);
    return;
  }
  const ModelKind* kind = model->kind;
  // Both steps hold the call: the encode step, which the core keeps until
  // the kernel has run, keeps the decoded inputs and weights alive.
  auto call = std::make_shared<KServeInferCall>(
      request, response, *std::move(model), std::move(outputs));
  runner->RunOp(
      operation, context,
      [call](ElementBudget* budget) { return call->Decode(budget); },
      [call](const attn::OpResult& result) { call->Encode(result); },
      [kind](absl::Status status) {
        return kind->WithInputNames(std::move(status));
      },
      responder);
}

KServeInferCall::KServeInferCall(const inference::ModelInferRequest* request,
                                 inference::ModelInferResponse* response,
                                 ServedModel model,
                                 std::vector<std::string> outputs)
    : request_(request),
      response_(response),
      model_(std::move(model)),
      outputs_(std::move(outputs)) {}

absl::StatusOr<OperationRequest> KServeInferCall::Decode(ElementBudget* budget) {
  RETURN_IF_ERROR(DecodeInputs(*request_, model_.signature, budget, &inputs_));
  const bool return_weights =
      std::find(outputs_.begin(), outputs_.end(), "attention_weights") !=
      outputs_.end();
  const ModelParameters parameters = ModelParametersOf(*request_);
  absl::StatusOr<OperationRequest> op = model_.kind->build_request(
      KindArguments{model_.signature.name, parameters, inputs_,
                    model_.stored.get(), return_weights});
  if (!op.ok()) return model_.kind->WithInputNames(op.status());
  return op;
}

void KServeInferCall::Encode(const attn::OpResult& result) const {
  Respond(*request_, outputs_, model_.kind->ResultTensors(result), response_);
}

}  // namespace attnserve
