// Fuzz target: KServe v2 ModelInfer decoding (inference.GRPCInferenceService,
// server/kserve/inference_service.cc: model resolution, requested outputs, inputs
// as raw_input_contents or typed contents, FP32 tensors and INT32/INT64
// valid lengths, parameters), then the library's validation and the kernels.
//
// Feeds: the bytes of an inference.ModelInferRequest in protobuf wire
// format, as tritonclient would send it. Bytes that do not parse are
// dropped. A parsed request is served by the real ModelInfer handler in
// process (fuzz/common/service_harness.h), against the built-in models and
// the example repository's (a private copy of deploy/models): decoding on
// this thread, the kernel on the worker (small calls on the reference
// kernels, larger ones on the CheckingBackend, which touches every element
// the validated params claim).
//
// Asserts, beyond "no crash, no leak, no undefined behaviour":
// - the status is OK or one a malformed request may get, never INTERNAL or
//   UNKNOWN;
// - an accepted request was well formed, checked here independently: the
//   model exists (version "" or "1"); raw_input_contents, when used, has one
//   entry per input; every input is one of the model's, given once, of its
//   datatype, with raw or typed contents but not both; at most as many
//   inputs as the model takes; every requested output once;
//   every FP32 input has as many elements as its shape's product (every
//   dimension >= 1, at most 2^31-1), all finite; every required input is
//   there; the tensors' shapes agree as the model documents; valid lengths
//   have shape [B], [B, 1] or [B, Lq] and every value lies in [0, Lk] (a
//   valid_lens input the server ignores is a failure: it must apply it or
//   refuse it); a valid_lens of shape [] is refused with INVALID_ARGUMENT
//   (RESOURCE_EXHAUSTED when a size limit is hit first);
// - the response echoes model_name and id, and has the requested outputs
//   (else the model's default), in order, each FP32 with raw contents of
//   exactly 4 bytes per element of its shape, the shape the model documents;
// - no kernel computes a result the server then refuses to send: outputs
//   and weights over the response limit (256 KiB here, --max_message_bytes)
//   must be refused before any kernel runs (checked by the CheckingBackend).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "fuzz/common/checking_backend.h"
#include "fuzz/common/service_harness.h"
#include "fuzz/common/shapes.h"
#include "inference/grpc_service.pb.h"
#include "server/models/model_catalogue.h"

namespace {

using Dims = std::vector<int64_t>;
using attn_fuzz::ElementCount;
using attn_fuzz::ServiceHarness;
using Spec = attnserve::ModelSignature;

std::string Str(const Dims& dims) { return attn_fuzz::DimsToString(dims); }

// The served model `name`, as the server documents it, or null.
const Spec* FindModel(const std::string& name, Spec* storage) {
  absl::StatusOr<attnserve::ServedModel> served =
      ServiceHarness::Get().catalogue().Resolve(name, "");
  if (!served.ok()) return nullptr;
  *storage = served->signature;
  return storage;
}

struct Lengths {
  Dims shape;
  std::vector<int64_t> values;
};

// The accepted inputs, checked one by one.
struct Accepted {
  std::map<std::string, Dims> floats;
  std::map<std::string, Lengths> lengths;
};

float Fp32At(const inference::ModelInferRequest& request, int input,
             int64_t i, bool raw) {
  if (raw) {
    float value;
    std::memcpy(&value, request.raw_input_contents(input).data() + 4 * i, 4);
    return value;
  }
  return request.inputs(input).contents().fp32_contents(static_cast<int>(i));
}

template <typename T>
std::vector<int64_t> RawIntegers(const std::string& bytes) {
  std::vector<int64_t> values(bytes.size() / sizeof(T));
  for (size_t i = 0; i < values.size(); ++i) {
    T value;
    std::memcpy(&value, bytes.data() + i * sizeof(T), sizeof(T));
    values[i] = value;
  }
  return values;
}

Accepted CheckInputs(const inference::ModelInferRequest& request,
                     const Spec& model) {
  Accepted accepted;
  const bool raw = request.raw_input_contents_size() > 0;
  FUZZ_CHECK(!raw || request.raw_input_contents_size() == request.inputs_size(),
             "%d raw contents for %d inputs accepted",
             request.raw_input_contents_size(), request.inputs_size());
  FUZZ_CHECK(request.inputs_size() <= static_cast<int>(model.inputs.size()),
             "%d inputs accepted for model '%s' of %zu",
             request.inputs_size(), model.name.c_str(), model.inputs.size());
  for (int i = 0; i < request.inputs_size(); ++i) {
    const auto& input = request.inputs(i);
    for (int j = 0; j < i; ++j) {
      FUZZ_CHECK(request.inputs(j).name() != input.name(),
                 "input '%s' given twice accepted", input.name().c_str());
    }
    if (raw && input.has_contents()) {
      const auto& typed = input.contents();
      FUZZ_CHECK(typed.bool_contents_size() + typed.int_contents_size() +
                         typed.int64_contents_size() +
                         typed.uint_contents_size() +
                         typed.uint64_contents_size() +
                         typed.fp32_contents_size() +
                         typed.fp64_contents_size() +
                         typed.bytes_contents_size() ==
                     0,
                 "input '%s': raw and typed contents together accepted",
                 input.name().c_str());
    }
    const attnserve::TensorSpec* spec = nullptr;
    for (const auto& candidate : model.inputs) {
      if (candidate.name == input.name()) spec = &candidate;
    }
    FUZZ_CHECK(spec != nullptr, "input '%s' of model '%s' accepted",
               input.name().c_str(), model.name.c_str());
    const Dims shape(input.shape().begin(), input.shape().end());
    const auto count = ElementCount(shape);
    FUZZ_CHECK(count.has_value(), "input '%s': shape %s accepted",
               input.name().c_str(), Str(shape).c_str());
    if (spec->datatype == "FP32") {
      FUZZ_CHECK(input.datatype() == "FP32", "input '%s': datatype '%s'",
                 input.name().c_str(), input.datatype().c_str());
      const int64_t given =
          raw ? static_cast<int64_t>(request.raw_input_contents(i).size())
              : 4 * static_cast<int64_t>(input.contents().fp32_contents_size());
      FUZZ_CHECK(given == 4 * *count, "input '%s': %lld bytes for %s accepted",
                 input.name().c_str(), static_cast<long long>(given),
                 Str(shape).c_str());
      for (int64_t e = 0; e < *count; ++e) {
        FUZZ_CHECK(std::isfinite(Fp32At(request, i, e, raw)),
                   "input '%s': element %lld is not finite",
                   input.name().c_str(), static_cast<long long>(e));
      }
      accepted.floats[input.name()] = shape;
      continue;
    }
    Lengths lengths{shape, {}};
    if (input.datatype() == "INT32") {
      lengths.values =
          raw ? RawIntegers<int32_t>(request.raw_input_contents(i))
              : std::vector<int64_t>(input.contents().int_contents().begin(),
                                     input.contents().int_contents().end());
      FUZZ_CHECK(!raw || static_cast<int64_t>(
                                request.raw_input_contents(i).size()) == 4 * *count,
                 "input '%s': raw INT32 size", input.name().c_str());
    } else {
      FUZZ_CHECK(input.datatype() == "INT64", "input '%s': datatype '%s'",
                 input.name().c_str(), input.datatype().c_str());
      lengths.values =
          raw ? RawIntegers<int64_t>(request.raw_input_contents(i))
              : std::vector<int64_t>(input.contents().int64_contents().begin(),
                                     input.contents().int64_contents().end());
      FUZZ_CHECK(!raw || static_cast<int64_t>(
                                request.raw_input_contents(i).size()) == 8 * *count,
                 "input '%s': raw INT64 size", input.name().c_str());
    }
    FUZZ_CHECK(static_cast<int64_t>(lengths.values.size()) == *count,
               "input '%s': %zu values for %s accepted", input.name().c_str(),
               lengths.values.size(), Str(shape).c_str());
    accepted.lengths[input.name()] = lengths;
  }
  for (const auto& spec : model.inputs) {
    FUZZ_CHECK(spec.optional || accepted.floats.count(spec.name),
               "required input '%s' missing, accepted", spec.name.c_str());
  }
  return accepted;
}

// Valid lengths given for `batch` entries of `rows` rows over `columns` keys
// must have been applied: of shape [B], [B, 1] or [B, rows], each value in
// [0, columns].
void CheckLengths(const Accepted& accepted, int64_t batch, int64_t rows,
                  int64_t columns) {
  auto it = accepted.lengths.find("valid_lens");
  if (it == accepted.lengths.end()) return;
  const Lengths& lengths = it->second;
  FUZZ_CHECK(lengths.shape == Dims({batch}) ||
                 lengths.shape == Dims({batch, 1}) ||
                 lengths.shape == Dims({batch, rows}),
             "valid_lens: shape %s accepted (and ignored?) for batch %lld, "
             "rows %lld",
             Str(lengths.shape).c_str(), static_cast<long long>(batch),
             static_cast<long long>(rows));
  for (int64_t value : lengths.values) {
    FUZZ_CHECK(value >= 0 && value <= columns,
               "valid_lens: %lld accepted with %lld keys",
               static_cast<long long>(value), static_cast<long long>(columns));
  }
}

// A valid_lens input of shape [] (a scalar: lengths for no batch entry) is
// refused with INVALID_ARGUMENT, never accepted (it would read as "no valid
// lengths", the softmax silently unmasked). When the model exists and the
// version is served, only a request-size limit hit first may answer
// otherwise (RESOURCE_EXHAUSTED); an unknown model may answer NOT_FOUND.
void CheckScalarLengthsRefused(const inference::ModelInferRequest& request,
                               const Spec* model, const grpc::Status& status) {
  bool scalar = false;
  for (const auto& input : request.inputs()) {
    scalar = scalar || (input.name() == "valid_lens" && input.shape_size() == 0);
  }
  if (!scalar) return;
  FUZZ_CHECK(!status.ok(), "valid_lens of shape [] accepted (model '%s')",
             request.model_name().c_str());
  const bool served = model != nullptr && (request.model_version().empty() ||
                                           request.model_version() == "1");
  const grpc::StatusCode code = status.error_code();
  FUZZ_CHECK(code == grpc::StatusCode::INVALID_ARGUMENT ||
                 code == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                 (!served && code == grpc::StatusCode::NOT_FOUND),
             "valid_lens of shape [] refused with status %d: %s",
             static_cast<int>(code), status.error_message().c_str());
}

// The shapes of the model's outputs, from its accepted inputs.
std::map<std::string, Dims> CheckModelInputs(
    const inference::ModelInferRequest& request, const Spec& model,
    const Accepted& in) {
  const auto& f = in.floats;
  std::map<std::string, Dims> outputs;
  switch (model.operation) {
    case attnserve::Operation::kMaskedSoftmax: {
      const Dims& x = f.at("X");
      FUZZ_CHECK(x.size() == 3, "X: %s accepted", Str(x).c_str());
      CheckLengths(in, x[0], x[1], x[2]);
      outputs["Y"] = x;
      break;
    }
    case attnserve::Operation::kBatchMatmul: {
      const Dims& a = f.at("X");
      const Dims& b = f.at("Y");
      FUZZ_CHECK(a.size() == 3 && b.size() == 3 && b[0] == a[0] && b[1] == a[2],
                 "X %s, Y %s accepted", Str(a).c_str(), Str(b).c_str());
      FUZZ_CHECK(in.lengths.empty(), "lengths for batch_matmul accepted");
      outputs["Z"] = {a[0], a[1], b[2]};
      break;
    }
    case attnserve::Operation::kScaledDotProductAttention:
    case attnserve::Operation::kAdditiveAttention: {
      const Dims& q = f.at("queries");
      const Dims& k = f.at("keys");
      const Dims& v = f.at("values");
      FUZZ_CHECK(q.size() == 3 && k.size() == 3 && v.size() == 3 &&
                     k[0] == q[0] && v[0] == q[0] && v[1] == k[1],
                 "queries %s, keys %s, values %s accepted", Str(q).c_str(),
                 Str(k).c_str(), Str(v).c_str());
      if (model.operation == attnserve::Operation::kScaledDotProductAttention) {
        FUZZ_CHECK(k[2] == q[2], "queries %s, keys %s accepted",
                   Str(q).c_str(), Str(k).c_str());
      }
      CheckLengths(in, q[0], q[1], k[1]);
      outputs["output"] = {q[0], q[1], v[2]};
      outputs["attention_weights"] = {q[0], q[1], k[1]};
      break;
    }
    default: {
      const Dims& x_train = f.at("x_train");
      const Dims& y_train = f.at("y_train");
      const Dims& x_query = f.at("x_query");
      FUZZ_CHECK(x_train.size() <= 2 && y_train.size() <= 2 &&
                     x_query.size() == x_train.size() &&
                     y_train[0] == x_train[0] &&
                     (x_train.size() == 1 || x_query[1] == x_train[1]),
                 "x_train %s, y_train %s, x_query %s accepted",
                 Str(x_train).c_str(), Str(y_train).c_str(),
                 Str(x_query).c_str());
      auto kernel = request.parameters().find("kernel");
      if (kernel != request.parameters().end()) {
        const std::string& name = kernel->second.string_param();
        FUZZ_CHECK(name == "gaussian" || name == "boxcar" ||
                       name == "constant" || name == "epanechnikov",
                   "kernel '%s' accepted", name.c_str());
      }
      auto bandwidth = request.parameters().find("bandwidth");
      if (bandwidth != request.parameters().end()) {
        const auto& p = bandwidth->second;
        FUZZ_CHECK(model.name == "nadaraya_watson",
                   "bandwidth accepted for the fitted model '%s'",
                   model.name.c_str());
        const double value =
            p.parameter_choice_case() == inference::InferParameter::kInt64Param
                ? static_cast<double>(p.int64_param())
                : p.double_param();
        FUZZ_CHECK(p.parameter_choice_case() ==
                           inference::InferParameter::kInt64Param ||
                       p.parameter_choice_case() ==
                           inference::InferParameter::kDoubleParam,
                   "bandwidth of parameter kind %d accepted",
                   static_cast<int>(p.parameter_choice_case()));
        FUZZ_CHECK(std::isfinite(static_cast<float>(value)) && value > 0,
                   "bandwidth %g accepted", value);
      }
      Dims y_pred = {x_query[0]};
      if (y_train.size() == 2) y_pred.push_back(y_train[1]);
      outputs["y_pred"] = y_pred;
      outputs["attention_weights"] = {x_query[0], x_train[0]};
      break;
    }
  }
  return outputs;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  inference::ModelInferRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  ServiceHarness& harness = ServiceHarness::Get();
  inference::ModelInferResponse response;
  const grpc::Status status =
      harness.Call([&](grpc::CallbackServerContext* context) {
        return harness.kserve().ModelInfer(context, &request, &response);
      });
  FUZZ_CHECK(attn_fuzz::IsExpectedErrorCode(status.error_code()),
             "status %d: %s", static_cast<int>(status.error_code()),
             status.error_message().c_str());
  Spec storage;
  const Spec* model = FindModel(request.model_name(), &storage);
  CheckScalarLengthsRefused(request, model, status);
  if (!status.ok()) return 0;

  FUZZ_CHECK(model != nullptr, "model '%s' accepted",
             request.model_name().c_str());
  FUZZ_CHECK(request.model_version().empty() || request.model_version() == "1",
             "version '%s' accepted", request.model_version().c_str());
  const Accepted accepted = CheckInputs(request, *model);
  const std::map<std::string, Dims> shapes =
      CheckModelInputs(request, *model, accepted);

  std::vector<std::string> names;
  for (const auto& output : request.outputs()) {
    for (const std::string& earlier : names) {
      FUZZ_CHECK(earlier != output.name(), "output '%s' requested twice accepted",
                 output.name().c_str());
    }
    names.push_back(output.name());
  }
  if (names.empty()) names = model->default_outputs;
  FUZZ_CHECK(response.model_name() == request.model_name() &&
                 response.id() == request.id(),
             "response for model '%s', id '%s'", response.model_name().c_str(),
             response.id().c_str());
  FUZZ_CHECK(response.outputs_size() == static_cast<int>(names.size()) &&
                 response.raw_output_contents_size() ==
                     static_cast<int>(names.size()),
             "%d outputs and %d raw contents for %zu requested",
             response.outputs_size(), response.raw_output_contents_size(),
             names.size());
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& output = response.outputs(i);
    FUZZ_CHECK(output.name() == names[i] && output.datatype() == "FP32",
               "output %d: '%s' (%s), requested '%s'", i, output.name().c_str(),
               output.datatype().c_str(), names[i].c_str());
    const Dims shape(output.shape().begin(), output.shape().end());
    auto expected = shapes.find(output.name());
    FUZZ_CHECK(expected != shapes.end() && shape == expected->second,
               "output '%s': shape %s", output.name().c_str(),
               Str(shape).c_str());
    const auto count = ElementCount(shape);
    FUZZ_CHECK(count.has_value() &&
                   static_cast<int64_t>(response.raw_output_contents(i).size()) ==
                       4 * *count,
               "output '%s': %zu bytes for %s", output.name().c_str(),
               response.raw_output_contents(i).size(), Str(shape).c_str());
  }
  return 0;
}
