// Fuzz target: the KServe v2 HTTP/REST codec (server/kserve/rest.cc):
// ParseRestInferRequest on a REST inference body (RapidJSON's SAX reader
// into inference.ModelInferRequest, JSON data and Triton's binary tensor
// data extension), then, for an accepted one, WriteRestInferResponse,
// RestErrorBody and MessageToRestJson.
//
// Feeds: byte 0 chooses the Inference-Header-Content-Length (byte 0 % 4):
//   0  none: bytes 1.. are the body, JSON alone;
//   1  bytes 1-2 (little-endian) are the header length, bytes 3.. the body
//      (a length beyond the body is the request's error to find);
//   2  bytes 1-2 are the length of the binary section, taken from the end
//      of bytes 3.. (all of it when longer): the header is the rest, so the
//      JSON can grow and shrink under mutation and the split stays put;
//   3  bytes 1-8 are the header length, any 64-bit value, bytes 9.. the body.
// The seeds (fuzz/corpus/kserve_rest/) are tritonclient-shaped requests:
// JSON data flat and nested, every datatype, data before datatype,
// parameters of every type, binary inputs and binary outputs.
//
// Asserts, beyond "no crash, no leak, no undefined behaviour":
// - an error is INVALID_ARGUMENT with a message, and RestErrorBody of it is
//   a JSON object whose "error" reads back as the message;
// - an accepted body is valid JSON (RapidJSON's DOM parses the header), and
//   the request holds, checked against that DOM: every input named, with a
//   datatype and exactly one raw_input_contents entry; an input sent as
//   JSON `data` has as many leaves as its shape's element count, raw
//   contents of exactly that many elements of its datatype's size, and each
//   element is its JSON value converted as the contract says (integers
//   exactly and in range, BOOL from true/false, FP32/FP64 the nearest value,
//   +-inf beyond the range, 0 below it); an input sent as binary holds its
//   binary_data_size bytes, and the binary inputs' bytes, in input order,
//   are exactly the binary section; `data` given once; the outputs' binary
//   flags are the ones the body gave; every other parameter (the request's,
//   an input's, an output's) is the last value given for its name, typed
//   as the contract says (bool, string, int64, uint64 above int64's range,
//   else the nearest double, +-inf beyond double's range);
// - MessageToRestJson of the decoded request is valid JSON;
// - the response writer: a synthetic FP32 output (the inputs' raw bytes as
//   floats, non-finite ones made finite) and an INT32 one, written for the
//   decoded request: the Inference-Header-Content-Length is set exactly
//   when an output goes as binary, the binary section is those outputs'
//   bytes in order with binary_data_size each, the JSON echoes the id, and
//   JSON data reads back bit-exactly (std::from_chars, and through
//   ParseRestInferRequest again).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "fuzz/common/check.h"
#include "inference/grpc_service.pb.h"
#include "rapidjson/document.h"
#include "server/kserve/rest.h"

namespace {

using attnserve::RestInferRequest;

constexpr rapidjson::ParseFlag kTextFlags = static_cast<rapidjson::ParseFlag>(
    rapidjson::kParseNumbersAsStringsFlag | rapidjson::kParseStopWhenDoneFlag |
    rapidjson::kParseValidateEncodingFlag);
constexpr rapidjson::ParseFlag kTypeFlags = static_cast<rapidjson::ParseFlag>(
    rapidjson::kParseStopWhenDoneFlag | rapidjson::kParseValidateEncodingFlag);

std::string Text(const rapidjson::Value& value) {
  return std::string(value.GetString(), value.GetStringLength());
}

// A printable excerpt of `text` for messages.
std::string Excerpt(absl::string_view text) {
  std::string out;
  for (char c : text.substr(0, 200)) {
    out += (c >= 0x20 && c < 0x7f) ? c : '.';
  }
  return out;
}

// The datatypes with a JSON form and their element sizes, from the
// contract (KServe v2's datatypes), written here independently.
enum class Kind { kSigned, kUnsigned, kFloat32, kFloat64, kBool, kNone };
struct Type {
  Kind kind = Kind::kNone;
  size_t bytes = 0;
};
Type TypeOf(const std::string& datatype) {
  static const std::pair<const char*, Type> kTypes[] = {
      {"BOOL", {Kind::kBool, 1}},      {"INT8", {Kind::kSigned, 1}},
      {"INT16", {Kind::kSigned, 2}},   {"INT32", {Kind::kSigned, 4}},
      {"INT64", {Kind::kSigned, 8}},   {"UINT8", {Kind::kUnsigned, 1}},
      {"UINT16", {Kind::kUnsigned, 2}}, {"UINT32", {Kind::kUnsigned, 4}},
      {"UINT64", {Kind::kUnsigned, 8}}, {"FP32", {Kind::kFloat32, 4}},
      {"FP64", {Kind::kFloat64, 8}},
  };
  for (const auto& [name, type] : kTypes) {
    if (datatype == name) return type;
  }
  return {};
}

// The product of `shape`, saturated at 2^62 (the codec refuses more).
int64_t ShapeCount(const google::protobuf::RepeatedField<int64_t>& shape) {
  __int128 count = 1;
  for (int64_t dimension : shape) {
    FUZZ_CHECK(dimension >= 0, "negative dimension %lld accepted",
               static_cast<long long>(dimension));
    count *= dimension;
    if (count > (__int128{1} << 62)) count = __int128{1} << 62;
  }
  return static_cast<int64_t>(count);
}

// The leaves of a `data` value (arrays at any depth), in row-major order:
// the text DOM's value (numbers as text) and the typed DOM's.
void Leaves(const rapidjson::Value& text, const rapidjson::Value& typed,
            std::vector<std::pair<const rapidjson::Value*,
                                  const rapidjson::Value*>>* out) {
  std::vector<std::pair<const rapidjson::Value*, const rapidjson::Value*>>
      stack = {{&text, &typed}};
  // Depth-first, children pushed in reverse for row-major order.
  while (!stack.empty()) {
    auto [t, y] = stack.back();
    stack.pop_back();
    FUZZ_CHECK(t->IsArray() == y->IsArray(), "the two parses disagree");
    if (!t->IsArray()) {
      out->emplace_back(t, y);
      continue;
    }
    FUZZ_CHECK(t->Size() == y->Size(), "the two parses disagree");
    for (rapidjson::SizeType i = t->Size(); i-- > 0;) {
      stack.emplace_back(&(*t)[i], &(*y)[i]);
    }
  }
}

template <typename T>
T ElementAt(const std::string& raw, size_t index) {
  T value;
  std::memcpy(&value, raw.data() + index * sizeof(T), sizeof(T));
  return value;
}

// Whether a decimal beyond a floating type's range overflows (else it
// underflows): its value as a long double is large.
bool Overflows(const std::string& text) {
  const long double value = std::strtold(text.c_str(), nullptr);
  return std::fabs(value) > 1.0L;
}

// Checks element `i` of `raw` against the JSON leaf (text, typed).
void CheckElement(const std::string& name, const std::string& datatype,
                  Type type, const std::string& raw, size_t i,
                  const rapidjson::Value& text, const rapidjson::Value& typed) {
  const char* input = name.c_str();
  if (type.kind == Kind::kBool) {
    FUZZ_CHECK(typed.IsBool(), "input '%s': BOOL element %zu accepted from a "
               "non-boolean", input, i);
    const uint8_t byte = ElementAt<uint8_t>(raw, i);
    FUZZ_CHECK(byte == (typed.GetBool() ? 1 : 0),
               "input '%s': BOOL element %zu is %u", input, i, byte);
    return;
  }
  FUZZ_CHECK(typed.IsNumber(), "input '%s' (%s): element %zu accepted from "
             "a JSON value that is no number", input, datatype.c_str(), i);
  const std::string number = Text(text);
  const char* first = number.data();
  const char* last = number.data() + number.size();
  switch (type.kind) {
    case Kind::kSigned: {
      int64_t value = 0;
      auto [end, error] = std::from_chars(first, last, value);
      FUZZ_CHECK(error == std::errc() && end == last,
                 "input '%s' (%s): element %zu '%s' accepted, not an int64",
                 input, datatype.c_str(), i, number.c_str());
      const int bits = 8 * static_cast<int>(type.bytes);
      const int64_t high = bits == 64 ? std::numeric_limits<int64_t>::max()
                                      : (int64_t{1} << (bits - 1)) - 1;
      FUZZ_CHECK(value <= high && value >= -high - 1,
                 "input '%s' (%s): element %zu '%s' accepted out of range",
                 input, datatype.c_str(), i, number.c_str());
      int64_t got = 0;
      switch (type.bytes) {
        case 1: got = ElementAt<int8_t>(raw, i); break;
        case 2: got = ElementAt<int16_t>(raw, i); break;
        case 4: got = ElementAt<int32_t>(raw, i); break;
        default: got = ElementAt<int64_t>(raw, i); break;
      }
      FUZZ_CHECK(got == value, "input '%s' (%s): element %zu '%s' became %lld",
                 input, datatype.c_str(), i, number.c_str(),
                 static_cast<long long>(got));
      return;
    }
    case Kind::kUnsigned: {
      uint64_t value = 0;
      auto [end, error] = std::from_chars(first, last, value);
      FUZZ_CHECK(error == std::errc() && end == last,
                 "input '%s' (%s): element %zu '%s' accepted, not a uint64",
                 input, datatype.c_str(), i, number.c_str());
      const int bits = 8 * static_cast<int>(type.bytes);
      FUZZ_CHECK(bits == 64 || value < (uint64_t{1} << bits),
                 "input '%s' (%s): element %zu '%s' accepted out of range",
                 input, datatype.c_str(), i, number.c_str());
      uint64_t got = 0;
      switch (type.bytes) {
        case 1: got = ElementAt<uint8_t>(raw, i); break;
        case 2: got = ElementAt<uint16_t>(raw, i); break;
        case 4: got = ElementAt<uint32_t>(raw, i); break;
        default: got = ElementAt<uint64_t>(raw, i); break;
      }
      FUZZ_CHECK(got == value, "input '%s' (%s): element %zu '%s' became %llu",
                 input, datatype.c_str(), i, number.c_str(),
                 static_cast<unsigned long long>(got));
      return;
    }
    case Kind::kFloat32: {
      const float got = ElementAt<float>(raw, i);
      float value = 0;
      auto [end, error] = std::from_chars(first, last, value);
      if (error == std::errc() && end == last) {
        uint32_t a, b;
        std::memcpy(&a, &got, 4);
        std::memcpy(&b, &value, 4);
        FUZZ_CHECK(a == b, "input '%s' (FP32): element %zu '%s' became %.9g, "
                   "not the nearest float %.9g", input, i, number.c_str(),
                   static_cast<double>(got), static_cast<double>(value));
      } else if (Overflows(number)) {
        FUZZ_CHECK(std::isinf(got) && std::signbit(got) == (number[0] == '-'),
                   "input '%s' (FP32): element %zu '%s', beyond float's range, "
                   "became %.9g (accepted: must be the infinity of its sign)",
                   input, i, number.c_str(), static_cast<double>(got));
      } else {
        FUZZ_CHECK(got == 0.0f, "input '%s' (FP32): element %zu '%s', nearer "
                   "0 than any float, became %.9g", input, i, number.c_str(),
                   static_cast<double>(got));
      }
      return;
    }
    case Kind::kFloat64: {
      const double got = ElementAt<double>(raw, i);
      double value = 0;
      auto [end, error] = std::from_chars(first, last, value);
      if (error == std::errc() && end == last) {
        uint64_t a, b;
        std::memcpy(&a, &got, 8);
        std::memcpy(&b, &value, 8);
        FUZZ_CHECK(a == b, "input '%s' (FP64): element %zu '%s' became %.17g, "
                   "not the nearest double %.17g", input, i, number.c_str(),
                   got, value);
      } else if (Overflows(number)) {
        FUZZ_CHECK(std::isinf(got) && std::signbit(got) == (number[0] == '-'),
                   "input '%s' (FP64): element %zu '%s', beyond double's "
                   "range, became %.17g", input, i, number.c_str(), got);
      } else {
        FUZZ_CHECK(got == 0.0, "input '%s' (FP64): element %zu '%s', nearer "
                   "0 than any double, became %.17g", input, i,
                   number.c_str(), got);
      }
      return;
    }
    default:
      FUZZ_CHECK(false, "input '%s': datatype '%s' accepted as JSON data",
                 input, datatype.c_str());
  }
}

// The members of `object` named `name`, in order (JSON allows duplicates;
// RapidJSON's DOM keeps them all).
std::vector<const rapidjson::Value*> Members(const rapidjson::Value& object,
                                             const char* name) {
  std::vector<const rapidjson::Value*> found;
  for (auto it = object.MemberBegin(); it != object.MemberEnd(); ++it) {
    if (Text(it->name) == name) found.push_back(&it->value);
  }
  return found;
}

// The InferParameters decoded from every `parameters` object of one owner
// (`text` and `typed`: the same objects from the two parses), the ones in
// `reserved` (the binary tensor data extension's) left out: each is the
// last value given for its name, typed as the contract says: a JSON bool as
// bool_param, a string as string_param, an integer as int64_param
// (uint64_param above int64's range), any other number as double_param, the
// nearest double (+-inf beyond double's range, 0 below it).
void CheckParameters(
    const google::protobuf::Map<std::string, inference::InferParameter>& got,
    const std::vector<const rapidjson::Value*>& text,
    const std::vector<const rapidjson::Value*>& typed,
    std::initializer_list<const char*> reserved, const std::string& owner_name) {
  using inference::InferParameter;
  const char* owner = owner_name.c_str();
  std::map<std::string, std::pair<const rapidjson::Value*,
                                  const rapidjson::Value*>> last;
  FUZZ_CHECK(text.size() == typed.size(), "the two parses disagree");
  for (size_t k = 0; k < text.size(); ++k) {
    FUZZ_CHECK(text[k]->IsObject() && typed[k]->IsObject(),
               "%s: parameters accepted as a non-object", owner);
    auto t = text[k]->MemberBegin();
    auto y = typed[k]->MemberBegin();
    for (; t != text[k]->MemberEnd(); ++t, ++y) {
      last[Text(t->name)] = {&t->value, &y->value};
    }
  }
  for (const char* name : reserved) last.erase(name);
  FUZZ_CHECK(got.size() == last.size(), "%s: %zu parameters decoded from %zu",
             owner, got.size(), last.size());
  for (const auto& [name, value] : last) {
    const char* key = name.c_str();
    FUZZ_CHECK(got.contains(name), "%s: parameter '%s' lost", owner, key);
    const InferParameter& parameter = got.at(name);
    const rapidjson::Value& y = *value.second;
    if (y.IsBool()) {
      FUZZ_CHECK(parameter.parameter_choice_case() ==
                         InferParameter::kBoolParam &&
                     parameter.bool_param() == y.GetBool(),
                 "%s: parameter '%s' is no bool_param %d", owner, key,
                 y.GetBool());
      continue;
    }
    if (y.IsString()) {
      FUZZ_CHECK(parameter.parameter_choice_case() ==
                         InferParameter::kStringParam &&
                     parameter.string_param() == Text(y),
                 "%s: parameter '%s' is no string_param", owner, key);
      continue;
    }
    FUZZ_CHECK(y.IsNumber(), "%s: parameter '%s' accepted as no scalar",
               owner, key);
    const std::string number = Text(*value.first);
    const char* first = number.data();
    const char* last_char = number.data() + number.size();
    int64_t signed_value = 0;
    uint64_t unsigned_value = 0;
    double double_value = 0;
    if (auto [end, error] = std::from_chars(first, last_char, signed_value);
        error == std::errc() && end == last_char) {
      FUZZ_CHECK(parameter.parameter_choice_case() ==
                         InferParameter::kInt64Param &&
                     parameter.int64_param() == signed_value,
                 "%s: parameter '%s' = %s is no int64_param", owner, key,
                 number.c_str());
    } else if (auto [end2, error2] =
                   std::from_chars(first, last_char, unsigned_value);
               error2 == std::errc() && end2 == last_char) {
      FUZZ_CHECK(parameter.parameter_choice_case() ==
                         InferParameter::kUint64Param &&
                     parameter.uint64_param() == unsigned_value,
                 "%s: parameter '%s' = %s is no uint64_param", owner, key,
                 number.c_str());
    } else {
      FUZZ_CHECK(parameter.parameter_choice_case() ==
                     InferParameter::kDoubleParam,
                 "%s: parameter '%s' = %s is no double_param", owner, key,
                 number.c_str());
      const double got_value = parameter.double_param();
      auto [end3, error3] = std::from_chars(first, last_char, double_value);
      if (error3 == std::errc() && end3 == last_char) {
        FUZZ_CHECK(std::memcmp(&got_value, &double_value, 8) == 0,
                   "%s: parameter '%s' = %s became %.17g, not %.17g", owner,
                   key, number.c_str(), got_value, double_value);
      } else if (Overflows(number)) {
        FUZZ_CHECK(std::isinf(got_value) &&
                       std::signbit(got_value) == (number[0] == '-'),
                   "%s: parameter '%s' = %s, beyond double's range, became "
                   "%.17g", owner, key, number.c_str(), got_value);
      } else {
        FUZZ_CHECK(got_value == 0, "%s: parameter '%s' = %s became %.17g",
                   owner, key, number.c_str(), got_value);
      }
    }
  }
}

// The request as accepted, against the JSON header's DOM (numbers as text:
// `text`; typed: `typed`) and the binary section.
void CheckAccepted(const RestInferRequest& out, absl::string_view json,
                   absl::string_view binary) {
  const inference::ModelInferRequest& request = out.request;
  FUZZ_CHECK(request.model_name() == "model" && request.model_version() == "",
             "model '%s' version '%s'", request.model_name().c_str(),
             request.model_version().c_str());
  rapidjson::Document text;
  text.Parse<kTextFlags>(json.data(), json.size());
  rapidjson::Document typed;
  typed.Parse<kTypeFlags>(json.data(), json.size());
  FUZZ_CHECK(!text.HasParseError() && !typed.HasParseError() &&
                 text.IsObject() && typed.IsObject(),
             "accepted a header that is no JSON object: '%s'",
             Excerpt(json).c_str());
  // Inputs: every "inputs" member's elements, in order.
  std::vector<std::pair<const rapidjson::Value*, const rapidjson::Value*>> inputs;
  {
    auto t = Members(text, "inputs");
    auto y = Members(typed, "inputs");
    FUZZ_CHECK(t.size() == y.size(), "the two parses disagree");
    for (size_t k = 0; k < t.size(); ++k) {
      FUZZ_CHECK(t[k]->IsArray(), "'inputs' accepted as a non-array");
      for (rapidjson::SizeType i = 0; i < t[k]->Size(); ++i) {
        inputs.emplace_back(&(*t[k])[i], &(*y[k])[i]);
      }
    }
  }
  FUZZ_CHECK(static_cast<size_t>(request.inputs_size()) == inputs.size(),
             "%d inputs decoded from %zu", request.inputs_size(), inputs.size());
  FUZZ_CHECK(request.raw_input_contents_size() == request.inputs_size(),
             "%d raw contents for %d inputs", request.raw_input_contents_size(),
             request.inputs_size());
  std::string binary_inputs;
  for (int i = 0; i < request.inputs_size(); ++i) {
    const auto& input = request.inputs(i);
    const std::string& raw = request.raw_input_contents(i);
    const std::string& name = input.name();
    FUZZ_CHECK(!name.empty(), "input %d accepted without a name", i);
    FUZZ_CHECK(!input.datatype().empty(), "input '%s' accepted without a "
               "datatype", name.c_str());
    FUZZ_CHECK(!input.has_contents(), "input '%s' has typed contents",
               name.c_str());
    const rapidjson::Value& t = *inputs[i].first;
    const rapidjson::Value& y = *inputs[i].second;
    FUZZ_CHECK(t.IsObject(), "input %d accepted as a non-object", i);
    // binary_data_size: the last one given, over every parameters object.
    std::optional<std::string> binary_size;
    bool binary_size_is_number = false;
    for (const rapidjson::Value* parameters : Members(y, "parameters")) {
      FUZZ_CHECK(parameters->IsObject(), "input '%s': parameters accepted as "
                 "a non-object", name.c_str());
      for (const rapidjson::Value* size :
           Members(*parameters, "binary_data_size")) {
        binary_size_is_number = size->IsNumber();
      }
    }
    for (const rapidjson::Value* parameters : Members(t, "parameters")) {
      for (const rapidjson::Value* size :
           Members(*parameters, "binary_data_size")) {
        binary_size = size->IsString() ? Text(*size) : std::string("?");
      }
    }
    CheckParameters(input.parameters(), Members(t, "parameters"),
                    Members(y, "parameters"), {"binary_data_size"},
                    "input '" + name + "'");
    FUZZ_CHECK(!binary_size.has_value() || binary_size_is_number,
               "input '%s': a binary_data_size that is no number accepted",
               name.c_str());
    const auto data_t = Members(t, "data");
    const auto data_y = Members(y, "data");
    FUZZ_CHECK(data_t.size() <= 1, "input '%s': 'data' given %zu times "
               "accepted", name.c_str(), data_t.size());
    if (binary_size.has_value()) {
      FUZZ_CHECK(data_t.empty(), "input '%s': both data and binary_data_size "
                 "accepted", name.c_str());
      uint64_t size = 0;
      auto [end, error] = std::from_chars(
          binary_size->data(), binary_size->data() + binary_size->size(), size);
      FUZZ_CHECK(error == std::errc() && end == binary_size->data() +
                                               binary_size->size(),
                 "input '%s': binary_data_size '%s' accepted", name.c_str(),
                 binary_size->c_str());
      FUZZ_CHECK(raw.size() == size, "input '%s': %zu raw bytes for "
                 "binary_data_size %llu", name.c_str(), raw.size(),
                 static_cast<unsigned long long>(size));
      binary_inputs += raw;
      continue;
    }
    FUZZ_CHECK(data_t.size() == 1, "input '%s' accepted with neither data "
               "nor binary_data_size", name.c_str());
    const Type type = TypeOf(input.datatype());
    FUZZ_CHECK(type.kind != Kind::kNone, "input '%s': datatype '%s' accepted "
               "as JSON data", name.c_str(), input.datatype().c_str());
    std::vector<std::pair<const rapidjson::Value*, const rapidjson::Value*>>
        leaves;
    Leaves(*data_t[0], *data_y[0], &leaves);
    const int64_t expected = ShapeCount(input.shape());
    FUZZ_CHECK(static_cast<int64_t>(leaves.size()) == expected,
               "input '%s': %zu data elements accepted for a shape of %lld",
               name.c_str(), leaves.size(), static_cast<long long>(expected));
    FUZZ_CHECK(raw.size() == leaves.size() * type.bytes,
               "input '%s' (%s): %zu raw bytes for %zu elements of %zu bytes",
               name.c_str(), input.datatype().c_str(), raw.size(),
               leaves.size(), type.bytes);
    for (size_t e = 0; e < leaves.size(); ++e) {
      CheckElement(name, input.datatype(), type, raw, e, *leaves[e].first,
                   *leaves[e].second);
    }
  }
  FUZZ_CHECK(binary_inputs == binary,
             "the binary inputs hold %zu bytes, the binary section %zu (or "
             "other bytes)", binary_inputs.size(), binary.size());

  // Outputs' binary flags: checked where names and flags are unambiguous.
  std::optional<bool> all_binary;
  for (const rapidjson::Value* parameters : Members(typed, "parameters")) {
    for (const rapidjson::Value* flag :
         Members(*parameters, "binary_data_output")) {
      FUZZ_CHECK(flag->IsBool(), "binary_data_output accepted as a non-bool");
      all_binary = flag->GetBool();
    }
  }
  FUZZ_CHECK(out.binary_data_output == all_binary.value_or(false),
             "binary_data_output %d, the body said %d", out.binary_data_output,
             all_binary.value_or(false));
  std::vector<const rapidjson::Value*> outputs;
  for (const rapidjson::Value* array : Members(typed, "outputs")) {
    for (rapidjson::SizeType i = 0; i < array->Size(); ++i) {
      outputs.push_back(&(*array)[i]);
    }
  }
  std::vector<const rapidjson::Value*> outputs_text;
  for (const rapidjson::Value* array : Members(text, "outputs")) {
    for (rapidjson::SizeType i = 0; i < array->Size(); ++i) {
      outputs_text.push_back(&(*array)[i]);
    }
  }
  FUZZ_CHECK(static_cast<size_t>(request.outputs_size()) == outputs.size(),
             "%d outputs decoded from %zu", request.outputs_size(),
             outputs.size());
  for (int i = 0; i < request.outputs_size(); ++i) {
    const std::string& name = request.outputs(i).name();
    bool unique = true;
    for (int j = 0; j < request.outputs_size(); ++j) {
      if (j != i && request.outputs(j).name() == name) unique = false;
    }
    std::optional<bool> flag;
    for (const rapidjson::Value* parameters :
         Members(*outputs[i], "parameters")) {
      for (const rapidjson::Value* value : Members(*parameters, "binary_data")) {
        FUZZ_CHECK(value->IsBool(), "binary_data accepted as a non-bool");
        flag = value->GetBool();
      }
    }
    CheckParameters(request.outputs(i).parameters(),
                    Members(*outputs_text[i], "parameters"),
                    Members(*outputs[i], "parameters"), {"binary_data"},
                    "output '" + name + "'");
    if (unique) {
      FUZZ_CHECK(out.Binary(name) == flag.value_or(out.binary_data_output),
                 "output '%s': Binary() %d, the body said %d", name.c_str(),
                 out.Binary(name), flag.value_or(out.binary_data_output));
    }
  }
  CheckParameters(request.parameters(), Members(text, "parameters"),
                  Members(typed, "parameters"), {"binary_data_output"},
                  "the request");

  // The decoded request as REST JSON (what a debug endpoint would print).
  const std::string rest = attnserve::MessageToRestJson(request);
  rapidjson::Document printed;
  printed.Parse<kTextFlags>(rest.data(), rest.size());
  FUZZ_CHECK(!printed.HasParseError() && printed.IsObject(),
             "MessageToRestJson wrote no JSON object: '%s'",
             Excerpt(rest).c_str());
}

// A response for the decoded request: an FP32 output from the inputs' raw
// bytes (non-finite values made finite) and an INT32 output, named after
// the requested outputs when there are some.
void CheckResponse(const RestInferRequest& out) {
  std::string bytes;
  for (const std::string& raw : out.request.raw_input_contents()) bytes += raw;
  bytes.resize(bytes.size() / 4 * 4);
  std::vector<float> values(bytes.size() / 4);
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, bytes.data() + 4 * i, 4);
    if ((bits & 0x7f800000u) == 0x7f800000u) bits &= 0x807fffffu;
    std::memcpy(&values[i], &bits, 4);
  }
  inference::ModelInferResponse response;
  response.set_model_name(out.request.model_name());
  response.set_model_version("1");
  response.set_id(out.request.id());
  const std::string float_name =
      out.request.outputs_size() > 0 ? out.request.outputs(0).name() : "output";
  const std::string int_name =
      out.request.outputs_size() > 1 ? out.request.outputs(1).name() : "count";
  auto* output = response.add_outputs();
  output->set_name(float_name);
  output->set_datatype("FP32");
  output->add_shape(static_cast<int64_t>(values.size()));
  response.add_raw_output_contents(
      std::string(reinterpret_cast<const char*>(values.data()),
                  values.size() * sizeof(float)));
  output = response.add_outputs();
  output->set_name(int_name);
  output->set_datatype("INT32");
  output->add_shape(1);
  const int32_t count = static_cast<int32_t>(values.size());
  response.add_raw_output_contents(
      std::string(reinterpret_cast<const char*>(&count), sizeof count));

  attnserve::RestBody body;
  attnserve::WriteRestInferResponse(out, response, &body);
  const bool float_binary = out.Binary(float_name);
  // INT32 always goes as binary.
  FUZZ_CHECK(body.json_length.has_value(), "no binary section for INT32");
  FUZZ_CHECK(*body.json_length <= body.bytes.size(), "json_length %zu of %zu",
             *body.json_length, body.bytes.size());
  const absl::string_view all(body.bytes);
  const absl::string_view json = all.substr(0, *body.json_length);
  const absl::string_view binary = all.substr(*body.json_length);
  const std::string expected_binary =
      (float_binary ? response.raw_output_contents(0) : std::string()) +
      response.raw_output_contents(1);
  FUZZ_CHECK(binary == expected_binary, "binary section of %zu bytes, "
             "expected %zu", binary.size(), expected_binary.size());
  rapidjson::Document document;
  document.Parse<kTextFlags>(json.data(), json.size());
  FUZZ_CHECK(!document.HasParseError() && document.IsObject(),
             "the response is no JSON object: '%s'", Excerpt(json).c_str());
  FUZZ_CHECK(
      out.request.id().empty()
          ? !document.HasMember("id")
          : (document.HasMember("id") && document["id"].IsString() &&
             Text(document["id"]) == out.request.id()),
      "id not echoed");
  const rapidjson::Value& outputs = document["outputs"];
  FUZZ_CHECK(outputs.IsArray() && outputs.Size() == 2, "outputs");
  const rapidjson::Value& first = outputs[0];
  FUZZ_CHECK(first.HasMember("name") && Text(first["name"]) == float_name,
             "output name");
  const rapidjson::Value& second = outputs[1];
  FUZZ_CHECK(second.HasMember("parameters") &&
                 Text(second["parameters"]["binary_data_size"]) == "4",
             "INT32 output's binary_data_size");
  if (float_binary) {
    FUZZ_CHECK(first.HasMember("parameters") && !first.HasMember("data") &&
                   Text(first["parameters"]["binary_data_size"]) ==
                       std::to_string(values.size() * 4),
               "binary FP32 output's binary_data_size");
    return;
  }
  FUZZ_CHECK(first.HasMember("data") && first["data"].IsArray() &&
                 first["data"].Size() == values.size(),
             "FP32 output's data");
  const rapidjson::Value& data = first["data"];
  for (rapidjson::SizeType i = 0; i < data.Size(); ++i) {
    const std::string number = Text(data[i]);
    float back = 0;
    auto [end, error] =
        std::from_chars(number.data(), number.data() + number.size(), back);
    FUZZ_CHECK(error == std::errc() && end == number.data() + number.size() &&
                   std::memcmp(&back, &values[i], 4) == 0,
               "FP32 %.9g written as '%s'", static_cast<double>(values[i]),
               number.c_str());
  }
  // And back through the request parser, as a client would send it.
  const size_t at = json.find("\"data\":");
  FUZZ_CHECK(at != absl::string_view::npos, "no data");
  const size_t end = json.find(']', at);
  const std::string again =
      "{\"inputs\":[{\"name\":\"y\",\"datatype\":\"FP32\",\"shape\":[" +
      std::to_string(values.size()) + "],\"data\":" +
      std::string(json.substr(at + 7, end + 1 - at - 7)) + "}]}";
  RestInferRequest parsed;
  const absl::Status status = attnserve::ParseRestInferRequest(
      "model", "", again, std::nullopt, &parsed);
  FUZZ_CHECK(status.ok(), "the response's data does not parse back: %s",
             std::string(status.message()).c_str());
  FUZZ_CHECK(parsed.request.raw_input_contents(0) ==
                 response.raw_output_contents(0),
             "the response's data parses back to other floats");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  std::optional<uint64_t> json_length;
  absl::string_view body;
  switch (data[0] % 4) {
    case 0:
      body = input.substr(1);
      break;
    case 1:
      if (size < 3) return 0;
      json_length = data[1] | (uint64_t{data[2]} << 8);
      body = input.substr(3);
      break;
    case 2: {
      if (size < 3) return 0;
      body = input.substr(3);
      const uint64_t tail = data[1] | (uint64_t{data[2]} << 8);
      json_length = body.size() - std::min<uint64_t>(tail, body.size());
      break;
    }
    default: {
      if (size < 9) return 0;
      uint64_t length = 0;
      for (int i = 0; i < 8; ++i) length |= uint64_t{data[1 + i]} << (8 * i);
      json_length = length;
      body = input.substr(9);
      break;
    }
  }
  RestInferRequest out;
  const absl::Status status =
      attnserve::ParseRestInferRequest("model", "", body, json_length, &out);
  if (!status.ok()) {
    FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument,
               "status %s", status.ToString().c_str());
    FUZZ_CHECK(!status.message().empty(), "an error without a message");
    const std::string error = attnserve::RestErrorBody(status);
    rapidjson::Document document;
    document.Parse<kTextFlags>(error.data(), error.size());
    FUZZ_CHECK(!document.HasParseError() && document.IsObject() &&
                   document.HasMember("error") && document["error"].IsString() &&
                   Text(document["error"]) == status.message(),
               "RestErrorBody '%s' of '%s'", Excerpt(error).c_str(),
               Excerpt(status.message()).c_str());
    return 0;
  }
  const absl::string_view json =
      json_length.has_value() ? body.substr(0, *json_length) : body;
  const absl::string_view binary =
      json_length.has_value() ? body.substr(*json_length) : absl::string_view();
  CheckAccepted(out, json, binary);
  CheckResponse(out);
  return 0;
}
