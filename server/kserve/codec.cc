#include "server/kserve/codec.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attn/status_macros.h"

namespace attnserve {
namespace {

// One valid-lengths input, INT32 or INT64, raw or typed, into `values`
// (INT64 values clamped into int32's range). `count` is its shape's size.
absl::Status DecodeLengthValues(const inference::ModelInferRequest& request,
                                int index, const std::string& field,
                                const attn::Shape& shape, int64_t count,
                                std::vector<int32_t>* values) {
  const auto& input = request.inputs(index);
  const bool raw = request.raw_input_contents_size() > 0;
  if (input.datatype() == "INT32") {
    if (raw) {
      const std::string& bytes = request.raw_input_contents(index);
      if (static_cast<int64_t>(bytes.size()) != 4 * count) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": shape ", attn::ShapeToString(shape), " needs ",
            4 * count, " raw bytes (INT32), got ", bytes.size()));
      }
      values->resize(count);
      std::memcpy(values->data(), bytes.data(), bytes.size());
    } else {
      values->assign(input.contents().int_contents().begin(),
                     input.contents().int_contents().end());
    }
  } else if (input.datatype() == "INT64") {
    std::vector<int64_t> wide;
    if (raw) {
      const std::string& bytes = request.raw_input_contents(index);
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
      values->push_back(static_cast<int32_t>(
          std::max<int64_t>(std::min<int64_t>(value, INT32_MAX), -1)));
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": datatype must be INT32 or INT64, got '", input.datatype(),
        "'"));
  }
  if (static_cast<int64_t>(values->size()) != count) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": shape ", attn::ShapeToString(shape), " needs ", count,
        " values, got ", values->size()));
  }
  return absl::OkStatus();
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

}  // namespace

absl::Status DecodeInputs(const inference::ModelInferRequest& request,
                          const ModelSignature& model, ElementBudget* budget,
                          ModelInputs* out) {
  // CheckInferRequestStructure has run: each input is the model's, once,
  // and raw contents are one per input.
  ModelInputs& inputs = *out;
  const bool raw = request.raw_input_contents_size() > 0;
  for (int i = 0; i < request.inputs_size(); ++i) {
    const auto& input = request.inputs(i);
    const std::string field = absl::StrCat("input '", input.name(), "'");
    const TensorSpec* spec = nullptr;
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
                                budget, &inputs.storage)
              : DecodeFloatValues(field, shape,
                                  input.contents().fp32_contents().data(),
                                  input.contents().fp32_contents_size(),
                                  budget);
      if (!view.ok()) return view.status();
      inputs.floats[input.name()] = *std::move(view);
      continue;
    }
    // Valid lengths. A scalar would read as "no valid lengths" downstream
    // (an empty shape), silently unmasked.
    if (shape.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": shape [] is a scalar; valid lengths need shape [B], "
          "[B, 1] (one per batch entry) or [B, Q] (one per query)"));
    }
    ASSIGN_OR_RETURN(const int64_t count, attn::CheckedNumElements(field, shape));
    RETURN_IF_ERROR(budget->Take(field, count));
    std::vector<int32_t>& values = inputs.owned_lengths.emplace_back();
    RETURN_IF_ERROR(DecodeLengthValues(request, i, field, shape, count, &values));
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

std::vector<std::string> RequestedOutputs(
    const inference::ModelInferRequest& request, const ModelSignature& model) {
  std::vector<std::string> names;
  for (const auto& output : request.outputs()) names.push_back(output.name());
  if (names.empty()) names = model.default_outputs;
  return names;
}

void Respond(const inference::ModelInferRequest& request,
             const std::vector<std::string>& names,
             const std::map<std::string, const attn::Tensor*>& tensors,
             inference::ModelInferResponse* response) {
  response->set_model_name(request.model_name());
  response->set_model_version(kServedModelVersion);
  response->set_id(request.id());
  for (const std::string& name : names) AddOutput(name, *tensors.at(name), response);
}

}  // namespace attnserve
