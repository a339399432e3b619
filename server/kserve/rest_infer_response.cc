// The REST inference response's writer (server/kserve/rest.h): the
// ModelInferResponse the core filled as JSON data or binary tensor data.
#include "server/kserve/rest.h"

#include <charconv>
#include <cstring>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "server/transport/rest_call.h"

namespace attnserve {
namespace {

// The longest shortest form of a float: "-1.17549435e-38".
constexpr size_t kMaxFloatChars = 15;

// Writes the shortest decimal that reads back as `value` (std::to_chars's
// characters) at `out`, which has kMaxFloatChars of room; returns the end.
char* WriteJsonFloat(float value, char* out) {
  if (!std::isfinite(value)) {
    std::memcpy(out, "null", 4);  // never for a result the core let through
    return out + 4;
  }
  if (value == 0 && std::signbit(value)) {
    std::memcpy(out, "-0.0", 4);  // "-0" reads back as the integer 0 in most parsers
    return out + 4;
  }
  return std::to_chars(out, out + kMaxFloatChars, value).ptr;
}

void AppendShape(const google::protobuf::RepeatedField<int64_t>& shape,
                 std::string* out) {
  out->push_back('[');
  for (int i = 0; i < shape.size(); ++i) {
    if (i > 0) out->push_back(',');
    absl::StrAppend(out, shape[i]);
  }
  out->push_back(']');
}

}  // namespace

void WriteRestInferResponse(const RestInferRequest& request,
                            const inference::ModelInferResponse& response,
                            RestBody* out) {
  std::string& json = out->bytes;
  json.clear();
  json.reserve(256);
  json.append("{\"model_name\":");
  AppendJsonString(response.model_name(), &json);
  json.append(",\"model_version\":");
  AppendJsonString(response.model_version(), &json);
  if (!response.id().empty()) {
    json.append(",\"id\":");
    AppendJsonString(response.id(), &json);
  }
  json.append(",\"outputs\":[");
  std::vector<int> binary_outputs;
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& output = response.outputs(i);
    const std::string& raw = i < response.raw_output_contents_size()
                                 ? response.raw_output_contents(i)
                                 : std::string();
    if (i > 0) json.push_back(',');
    json.append("{\"name\":");
    AppendJsonString(output.name(), &json);
    json.append(",\"datatype\":");
    AppendJsonString(output.datatype(), &json);
    json.append(",\"shape\":");
    AppendShape(output.shape(), &json);
    if (request.Binary(output.name()) || output.datatype() != "FP32") {
      absl::StrAppend(&json, ",\"parameters\":{\"binary_data_size\":",
                      raw.size(), "}}");
      binary_outputs.push_back(i);
      continue;
    }
    json.append(",\"data\":[");
    // Written in place: room for the longest number and its comma each,
    // then cut to what was written.
    const size_t count = raw.size() / sizeof(float);
    const size_t start = json.size();
    json.resize(start + count * (kMaxFloatChars + 1));
    char* const first = json.data() + start;
    char* end = first;
    for (size_t e = 0; e < count; ++e) {
      if (e > 0) *end++ = ',';
      float value;
      std::memcpy(&value, raw.data() + e * sizeof value, sizeof value);
      end = WriteJsonFloat(value, end);
    }
    json.resize(start + static_cast<size_t>(end - first));
    json.append("]}");
  }
  json.append("]}");
  if (binary_outputs.empty()) {
    out->json_length.reset();
    return;
  }
  out->json_length = json.size();
  size_t total = json.size();
  for (int i : binary_outputs) {
    if (i < response.raw_output_contents_size()) {
      total += response.raw_output_contents(i).size();
    }
  }
  json.reserve(total);
  for (int i : binary_outputs) {
    if (i < response.raw_output_contents_size()) {
      json.append(response.raw_output_contents(i));
    }
  }
}

}  // namespace attnserve
