// Fuzz target: the typed API's request decoding and validation
// (attention.v1.AttentionService, server/typed/attention_service.cc and
// server/typed/tensor_codec.cc, then attn/validate.cc through the engine).
//
// Feeds: byte 0 picks the RPC (byte % 6: MaskedSoftmax, BatchMatmul,
// ScaledDotProductAttention, AdditiveAttention, NadarayaWatson,
// FitBandwidth); the rest is that RPC's request message in protobuf wire
// format, as a client would send it (protobuf-mutator is not in Debian, so
// libFuzzer mutates the serialized bytes). Bytes that do not parse are
// dropped, as gRPC would. A parsed request is served by the real handler,
// in process (fuzz/common/service_harness.h): decoding on this thread, the
// kernel on the worker, small calls on the reference kernels and larger ones
// on the CheckingBackend, which touches every element the validated params
// claim (AddressSanitizer then catches a view shorter than its shape).
//
// Asserts, beyond "no crash, no leak, no undefined behaviour":
// - the status is OK or one a malformed request may get (INVALID_ARGUMENT,
//   RESOURCE_EXHAUSTED, NOT_FOUND, FAILED_PRECONDITION, PERMISSION_DENIED),
//   never INTERNAL or UNKNOWN;
// - an accepted request was well formed, checked here independently of the
//   decoder: every input tensor has exactly one of values/raw, as many
//   elements as its shape's product (every dimension >= 1, at most 2^31-1),
//   all finite; valid lengths have shape (B,) or (B, Lq) and lie in
//   [0, Lk]; the shapes agree as the API documents;
// - the response has the documented output shape, in the requested
//   encoding, with as many elements as that shape says, and weights exactly
//   when they were asked for;
// - where the reference kernels ran: every output element is finite (the
//   inputs were; engine.h promises finite softmax-based results, at every
//   precision), softmax rows and attention weight rows are exactly zero at
//   and past their valid length (and past the diagonal when causal), and
//   sum to 1 (or are all zero for a zero length);
// - INVALID_ARGUMENT names the field at fault: its message starts with a
//   field of the request (or "output"/"weights": a result over 2^31-1
//   elements), as the README promises;
// - FitBandwidth returns one loss per epoch, finite numbers and a positive
//   bandwidth (a divergent fit is INVALID_ARGUMENT, never an OK inf/NaN);
// - no kernel computes a result the server then refuses to send: outputs
//   and weights over the response limit (256 KiB here, --max_message_bytes)
//   must be refused before any kernel runs (checked by the CheckingBackend).
// FitBandwidth's `epochs` is capped at 5 before the call (the range check
// still sees values outside [1, 100000]) so that one input cannot take
// seconds.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "attention/v1/attention.pb.h"
#include "fuzz/common/checking_backend.h"
#include "fuzz/common/service_harness.h"
#include "fuzz/common/shapes.h"

namespace v1 = ::attention::v1;

namespace {

using Dims = std::vector<int64_t>;
using attn_fuzz::ElementCount;
using attn_fuzz::ServiceHarness;

std::string Str(const Dims& dims) { return attn_fuzz::DimsToString(dims); }

Dims DimsOf(const google::protobuf::RepeatedField<int64_t>& shape) {
  return Dims(shape.begin(), shape.end());
}

// The element `i` of a tensor in either encoding.
float ElementAt(const v1::Tensor& t, int64_t i) {
  if (!t.raw().empty()) {
    float value;
    std::memcpy(&value, t.raw().data() + 4 * i, 4);
    return value;
  }
  return t.values(static_cast<int>(i));
}

// An input the server accepted: checks it was well formed; returns its shape.
Dims Accepted(const char* field, const v1::Tensor& t) {
  const Dims shape = DimsOf(t.shape());
  const auto count = ElementCount(shape);
  FUZZ_CHECK(count.has_value(), "%s: shape %s was accepted", field,
             Str(shape).c_str());
  const bool has_values = t.values_size() > 0;
  const bool has_raw = !t.raw().empty();
  FUZZ_CHECK(has_values != has_raw, "%s: values %d, raw %zu bytes accepted",
             field, t.values_size(), t.raw().size());
  if (has_values) {
    FUZZ_CHECK(t.values_size() == *count, "%s: %d values for %s accepted",
               field, t.values_size(), Str(shape).c_str());
  } else {
    FUZZ_CHECK(static_cast<int64_t>(t.raw().size()) == 4 * *count,
               "%s: %zu raw bytes for %s accepted", field, t.raw().size(),
               Str(shape).c_str());
  }
  for (int64_t i = 0; i < *count; ++i) {
    FUZZ_CHECK(std::isfinite(ElementAt(t, i)), "%s: element %lld is %g",
               field, static_cast<long long>(i),
               static_cast<double>(ElementAt(t, i)));
  }
  return shape;
}

// Accepted valid lengths for `batch` entries of `rows` query rows over
// `columns` keys; returns the limit of (b, row) (columns when absent).
struct Lengths {
  const v1::Lengths* wire = nullptr;
  int64_t rows = 0;
  int64_t columns = 0;
  int64_t Limit(int64_t b, int64_t row) const {
    if (wire->shape_size() == 0) return columns;
    if (wire->shape_size() == 1) return wire->values(static_cast<int>(b));
    return wire->values(static_cast<int>(b * rows + row));
  }
};

Lengths AcceptedLengths(const v1::Lengths& wire, int64_t batch, int64_t rows,
                        int64_t columns) {
  const Dims shape = DimsOf(wire.shape());
  if (shape.empty()) {
    FUZZ_CHECK(wire.values_size() == 0, "valid_lens: values without a shape");
  } else {
    FUZZ_CHECK(shape == Dims({batch}) || shape == Dims({batch, rows}),
               "valid_lens: shape %s accepted for batch %lld, rows %lld",
               Str(shape).c_str(), static_cast<long long>(batch),
               static_cast<long long>(rows));
    FUZZ_CHECK(wire.values_size() == *ElementCount(shape),
               "valid_lens: %d values for %s accepted", wire.values_size(),
               Str(shape).c_str());
    for (int32_t value : wire.values()) {
      FUZZ_CHECK(value >= 0 && value <= columns,
                 "valid_lens: %d accepted with %lld keys", value,
                 static_cast<long long>(columns));
    }
  }
  return Lengths{&wire, rows, columns};
}

// Checks an output tensor's shape, encoding and element count.
void CheckOutput(const char* field, const v1::Tensor& t,
                 v1::TensorEncoding encoding, const Dims& expected) {
  const Dims shape = DimsOf(t.shape());
  FUZZ_CHECK(shape == expected, "%s: shape %s, expected %s", field,
             Str(shape).c_str(), Str(expected).c_str());
  const auto count = ElementCount(shape);
  FUZZ_CHECK(count.has_value(), "%s: shape %s", field, Str(shape).c_str());
  if (encoding == v1::TENSOR_ENCODING_RAW) {
    FUZZ_CHECK(t.values_size() == 0 &&
                   static_cast<int64_t>(t.raw().size()) == 4 * *count,
               "%s: %zu raw bytes for %s", field, t.raw().size(),
               Str(shape).c_str());
  } else {
    FUZZ_CHECK(t.raw().empty() && t.values_size() == *count,
               "%s: %d values for %s", field, t.values_size(),
               Str(shape).c_str());
  }
}

// Every element finite: a softmax-based result computed from finite inputs
// (engine.h: finite inputs never yield a NaN or infinite result, but for
// BatchMatmul).
void CheckFinite(const char* field, const v1::Tensor& t) {
  const auto count = ElementCount(DimsOf(t.shape()));
  for (int64_t i = 0; count.has_value() && i < *count; ++i) {
    const float value = ElementAt(t, i);
    FUZZ_CHECK(std::isfinite(value),
               "%s: element %lld is %g, computed from finite inputs", field,
               static_cast<long long>(i), static_cast<double>(value));
  }
}

// Rows of `width` probabilities: exactly zero from `limit(row)` on; summing
// to 1 (within float rounding) when `computed` and limit > 0, else all zero.
template <typename Limit>
void CheckProbabilityRows(const char* field, const v1::Tensor& t, int64_t rows,
                          int64_t width, bool computed, Limit limit) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t valid = limit(r);
    double sum = 0.0;
    for (int64_t j = 0; j < width; ++j) {
      const float w = ElementAt(t, r * width + j);
      if (j >= valid) {
        FUZZ_CHECK(w == 0.0f, "%s: row %lld, column %lld >= valid %lld is %g",
                   field, static_cast<long long>(r), static_cast<long long>(j),
                   static_cast<long long>(valid), static_cast<double>(w));
      }
      FUZZ_CHECK(w >= 0.0f && w <= 1.0f, "%s: weight %g", field,
                 static_cast<double>(w));
      sum += w;
    }
    if (valid == 0) {
      FUZZ_CHECK(sum == 0.0, "%s: zero-length row %lld sums to %g", field,
                 static_cast<long long>(r), sum);
    } else if (computed) {
      FUZZ_CHECK(std::fabs(sum - 1.0) < 1e-3, "%s: row %lld sums to %g", field,
                 static_cast<long long>(r), sum);
    }
  }
}

bool Reference(const v1::ExecutionInfo& info) {
  FUZZ_CHECK(info.implementation() == "reference" ||
                 info.implementation() == attn_fuzz::CheckingBackend::kName,
             "implementation '%s'", info.implementation().c_str());
  return info.implementation() == "reference";
}

// INVALID_ARGUMENT names the field at fault (README, "Errors"): the message
// starts with one of `fields` (the request's, or "output"/"weights" for a
// result too large to hold) and a colon.
void CheckNamesField(const grpc::Status& status,
                     std::initializer_list<const char*> fields) {
  if (status.error_code() != grpc::StatusCode::INVALID_ARGUMENT) return;
  const std::string& message = status.error_message();
  for (const char* field : fields) {
    const size_t length = std::strlen(field);
    if (message.compare(0, length, field) == 0 && message.size() > length &&
        message[length] == ':') {
      return;
    }
  }
  FUZZ_CHECK(false, "INVALID_ARGUMENT names no request field: %s",
             message.c_str());
}

template <typename Request, typename Response, typename Method>
grpc::Status Serve(Method method, const Request& request, Response* response) {
  ServiceHarness& harness = ServiceHarness::Get();
  const grpc::Status status =
      harness.Call([&](grpc::CallbackServerContext* context) {
        return (harness.typed().*method)(context, &request, response);
      });
  FUZZ_CHECK(attn_fuzz::IsExpectedErrorCode(status.error_code()),
             "status %d: %s", static_cast<int>(status.error_code()),
             status.error_message().c_str());
  return status;
}

void MaskedSoftmax(const v1::MaskedSoftmaxRequest& request) {
  v1::MaskedSoftmaxResponse response;
  const grpc::Status status =
      Serve(&attnserve::AttentionService::MaskedSoftmax, request, &response);
  CheckNamesField(status, {"x", "valid_lens", "output_encoding", "output"});
  if (!status.ok()) return;
  const Dims x = Accepted("x", request.x());
  FUZZ_CHECK(x.size() == 3, "x: rank %zu accepted", x.size());
  const Lengths lens = AcceptedLengths(request.valid_lens(), x[0], x[1], x[2]);
  CheckOutput("output", response.output(), request.output_encoding(), x);
  if (Reference(response.info())) CheckFinite("output", response.output());
  CheckProbabilityRows("output", response.output(), x[0] * x[1], x[2],
                       Reference(response.info()), [&](int64_t r) {
                         return lens.Limit(r / x[1], r % x[1]);
                       });
}

void BatchMatmul(const v1::BatchMatmulRequest& request) {
  v1::BatchMatmulResponse response;
  const grpc::Status status =
      Serve(&attnserve::AttentionService::BatchMatmul, request, &response);
  CheckNamesField(status, {"a", "b", "precision", "output_encoding", "output"});
  if (!status.ok()) return;
  const Dims a = Accepted("a", request.a());
  const Dims b = Accepted("b", request.b());
  FUZZ_CHECK(a.size() == 3 && b.size() == 3 && b[0] == a[0] && b[1] == a[2],
             "a %s and b %s accepted", Str(a).c_str(), Str(b).c_str());
  CheckOutput("output", response.output(), request.output_encoding(),
              {a[0], a[1], b[2]});
  Reference(response.info());
}

void ScaledDotProductAttention(const v1::AttentionRequest& request) {
  v1::AttentionResponse response;
  const grpc::Status status = Serve(
      &attnserve::AttentionService::ScaledDotProductAttention, request,
      &response);
  CheckNamesField(status, {"queries", "keys", "values", "valid_lens", "scale",
                           "score", "precision", "output_encoding", "output",
                           "weights"});
  if (!status.ok()) return;
  const Dims q = Accepted("queries", request.queries());
  const Dims k = Accepted("keys", request.keys());
  const Dims v = Accepted("values", request.values());
  const size_t rank = q.size();
  FUZZ_CHECK((rank == 3 || rank == 4) && k.size() == rank && v.size() == rank,
             "queries %s, keys %s, values %s accepted", Str(q).c_str(),
             Str(k).c_str(), Str(v).c_str());
  for (size_t axis = 0; axis + 2 < rank; ++axis) {
    FUZZ_CHECK(k[axis] == q[axis] && v[axis] == q[axis],
               "queries %s, keys %s, values %s accepted", Str(q).c_str(),
               Str(k).c_str(), Str(v).c_str());
  }
  FUZZ_CHECK(k[rank - 1] == q[rank - 1] && v[rank - 2] == k[rank - 2],
             "queries %s, keys %s, values %s accepted", Str(q).c_str(),
             Str(k).c_str(), Str(v).c_str());
  FUZZ_CHECK(!request.has_scale() ||
                 (std::isfinite(request.scale()) && request.scale() > 0),
             "scale %g accepted", static_cast<double>(request.scale()));
  const int64_t lq = q[rank - 2], lk = k[rank - 2];
  const Lengths lens = AcceptedLengths(request.valid_lens(), q[0], lq, lk);
  Dims out = q;
  out.back() = v.back();
  CheckOutput("output", response.output(), request.output_encoding(), out);
  if (Reference(response.info())) CheckFinite("output", response.output());
  if (!request.return_weights()) {
    FUZZ_CHECK(!response.has_weights(), "weights returned unasked");
    return;
  }
  Dims weights = q;
  weights.back() = lk;
  CheckOutput("weights", response.weights(), request.output_encoding(),
              weights);
  const int64_t heads = rank == 4 ? q[1] : 1;
  CheckProbabilityRows("weights", response.weights(), q[0] * heads * lq, lk,
                       Reference(response.info()), [&](int64_t r) {
                         const int64_t row = r % lq;
                         int64_t limit = lens.Limit(r / (heads * lq), row);
                         if (request.causal()) limit = std::min(limit, row + 1);
                         return limit;
                       });
}

void AdditiveAttention(const v1::AdditiveAttentionRequest& request) {
  v1::AdditiveAttentionResponse response;
  const grpc::Status status = Serve(
      &attnserve::AttentionService::AdditiveAttention, request, &response);
  CheckNamesField(status, {"queries", "keys", "values", "weights.w_q",
                           "weights.w_k", "weights.w_v", "valid_lens",
                           "output_encoding", "output", "weights"});
  if (!status.ok()) return;
  const Dims q = Accepted("queries", request.queries());
  const Dims k = Accepted("keys", request.keys());
  const Dims v = Accepted("values", request.values());
  FUZZ_CHECK(q.size() == 3 && k.size() == 3 && v.size() == 3 &&
                 k[0] == q[0] && v[0] == q[0] && v[1] == k[1],
             "queries %s, keys %s, values %s accepted", Str(q).c_str(),
             Str(k).c_str(), Str(v).c_str());
  if (request.has_weights()) {
    const Dims w_q = Accepted("weights.w_q", request.weights().w_q());
    const Dims w_k = Accepted("weights.w_k", request.weights().w_k());
    const Dims w_v = Accepted("weights.w_v", request.weights().w_v());
    FUZZ_CHECK(w_q.size() == 2 && w_k.size() == 2 && w_v.size() == 1 &&
                   w_q[1] == q[2] && w_k[1] == k[2] && w_k[0] == w_q[0] &&
                   w_v[0] == w_q[0],
               "w_q %s, w_k %s, w_v %s accepted", Str(w_q).c_str(),
               Str(w_k).c_str(), Str(w_v).c_str());
  } else {
    FUZZ_CHECK(request.has_weights_name(), "accepted without weights");
  }
  const Lengths lens = AcceptedLengths(request.valid_lens(), q[0], q[1], k[1]);
  CheckOutput("output", response.output(), request.output_encoding(),
              {q[0], q[1], v[2]});
  if (Reference(response.info())) CheckFinite("output", response.output());
  if (!request.return_weights()) {
    FUZZ_CHECK(!response.has_weights(), "weights returned unasked");
    return;
  }
  CheckOutput("weights", response.weights(), request.output_encoding(),
              {q[0], q[1], k[1]});
  CheckProbabilityRows(
      "weights", response.weights(), q[0] * q[1], k[1],
      Reference(response.info()),
      [&](int64_t r) { return lens.Limit(r / q[1], r % q[1]); });
}

void NadarayaWatson(const v1::NadarayaWatsonRequest& request) {
  v1::NadarayaWatsonResponse response;
  const grpc::Status status = Serve(
      &attnserve::AttentionService::NadarayaWatson, request, &response);
  CheckNamesField(status, {"x_train", "y_train", "x_query", "kernel",
                           "bandwidth", "output_encoding", "output",
                           "weights"});
  if (!status.ok()) return;
  const Dims x_train = Accepted("x_train", request.x_train());
  const Dims y_train = Accepted("y_train", request.y_train());
  const Dims x_query = Accepted("x_query", request.x_query());
  FUZZ_CHECK(x_train.size() <= 2 && y_train.size() <= 2 &&
                 x_query.size() == x_train.size() &&
                 y_train[0] == x_train[0] &&
                 (x_train.size() == 1 || x_query[1] == x_train[1]),
             "x_train %s, y_train %s, x_query %s accepted",
             Str(x_train).c_str(), Str(y_train).c_str(), Str(x_query).c_str());
  FUZZ_CHECK(!request.has_bandwidth() || (std::isfinite(request.bandwidth()) &&
                                          request.bandwidth() > 0),
             "bandwidth %g accepted", static_cast<double>(request.bandwidth()));
  Dims out = {x_query[0]};
  if (y_train.size() == 2) out.push_back(y_train[1]);
  CheckOutput("output", response.output(), request.output_encoding(), out);
  if (Reference(response.info())) CheckFinite("output", response.output());
  if (!request.return_weights()) {
    FUZZ_CHECK(!response.has_weights(), "weights returned unasked");
    return;
  }
  CheckOutput("weights", response.weights(), request.output_encoding(),
              {x_query[0], x_train[0]});
  // A query with no kernel mass in reach gets all-zero weights: rows sum to
  // 1 or 0; none is masked.
  const int64_t n = x_train[0];
  const bool computed = Reference(response.info());
  for (int64_t r = 0; r < x_query[0]; ++r) {
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      const float w = ElementAt(response.weights(), r * n + j);
      FUZZ_CHECK(w >= 0.0f && w <= 1.0f, "weights: %g", static_cast<double>(w));
      sum += w;
    }
    FUZZ_CHECK(sum == 0.0 || (computed && std::fabs(sum - 1.0) < 1e-3),
               "weights: row %lld sums to %g", static_cast<long long>(r), sum);
  }
}

void FitBandwidth(v1::FitBandwidthRequest request) {
  if (request.has_epochs() && request.epochs() > 5 &&
      request.epochs() <= 100000) {
    request.set_epochs(5);
  }
  v1::FitBandwidthResponse response;
  const grpc::Status status =
      Serve(&attnserve::AttentionService::FitBandwidth, request, &response);
  CheckNamesField(status, {"x_train", "y_train", "initial_bandwidth",
                           "learning_rate", "epochs", "save_as"});
  if (!status.ok()) return;
  const Dims x_train = Accepted("x_train", request.x_train());
  const Dims y_train = Accepted("y_train", request.y_train());
  FUZZ_CHECK(x_train.size() <= 2 && y_train.size() <= 2 &&
                 y_train[0] == x_train[0] && x_train[0] >= 2,
             "x_train %s, y_train %s accepted", Str(x_train).c_str(),
             Str(y_train).c_str());
  const int epochs = request.has_epochs() ? request.epochs() : 5;
  FUZZ_CHECK(epochs >= 1 && response.loss_per_epoch_size() == epochs,
             "%d losses for %d epochs", response.loss_per_epoch_size(), epochs);
  FUZZ_CHECK(response.info().implementation() == "reference",
             "implementation '%s'", response.info().implementation().c_str());
  // From finite inputs, a finite fit (engine.h: no NaN or infinite result
  // from finite inputs); a divergent fit must be an error, not an OK NaN.
  // The bandwidth answered is one a model can hold (fit.h: |w|; a fitted model
  // and NadarayaWatson take finite positive values only).
  FUZZ_CHECK(std::isfinite(response.bandwidth()) && response.bandwidth() > 0 &&
                 std::isfinite(response.final_loss()),
             "fit returned bandwidth %g, final loss %g",
             static_cast<double>(response.bandwidth()), response.final_loss());
  for (double loss : response.loss_per_epoch()) {
    FUZZ_CHECK(std::isfinite(loss), "fit returned a loss of %g", loss);
  }
}

template <typename Request>
bool Parse(const uint8_t* data, size_t size, Request* request) {
  return request->ParseFromArray(data, static_cast<int>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int operation = data[0] % 6;
  ++data;
  --size;
  switch (operation) {
    case 0: {
      v1::MaskedSoftmaxRequest request;
      if (Parse(data, size, &request)) MaskedSoftmax(request);
      break;
    }
    case 1: {
      v1::BatchMatmulRequest request;
      if (Parse(data, size, &request)) BatchMatmul(request);
      break;
    }
    case 2: {
      v1::AttentionRequest request;
      if (Parse(data, size, &request)) ScaledDotProductAttention(request);
      break;
    }
    case 3: {
      v1::AdditiveAttentionRequest request;
      if (Parse(data, size, &request)) AdditiveAttention(request);
      break;
    }
    case 4: {
      v1::NadarayaWatsonRequest request;
      if (Parse(data, size, &request)) NadarayaWatson(request);
      break;
    }
    default: {
      v1::FitBandwidthRequest request;
      if (Parse(data, size, &request)) FitBandwidth(std::move(request));
      break;
    }
  }
  return 0;
}
