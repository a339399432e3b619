// The REST inference body's reader (server/kserve/rest.h): JSON or
// binary tensor data into the ModelInferRequest the gRPC service would
// have received.
#include "server/kserve/rest.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/kserve/rest_json.h"

namespace attnserve {
namespace {

using inference::InferParameter;
using inference::ModelInferRequest;

// How one element of a datatype is read from JSON and laid out in raw
// bytes (little-endian, as raw_input_contents).
enum class Element { kFloat32, kFloat64, kSigned, kUnsigned, kBool, kNone };

struct Datatype {
  Element element = Element::kNone;
  int bytes = 0;
};

Datatype DatatypeOf(absl::string_view name) {
  if (name == "FP32") return {Element::kFloat32, 4};
  if (name == "FP64") return {Element::kFloat64, 8};
  if (name == "INT8") return {Element::kSigned, 1};
  if (name == "INT16") return {Element::kSigned, 2};
  if (name == "INT32") return {Element::kSigned, 4};
  if (name == "INT64") return {Element::kSigned, 8};
  if (name == "UINT8") return {Element::kUnsigned, 1};
  if (name == "UINT16") return {Element::kUnsigned, 2};
  if (name == "UINT32") return {Element::kUnsigned, 4};
  if (name == "UINT64") return {Element::kUnsigned, 8};
  if (name == "BOOL") return {Element::kBool, 1};
  return {};  // FP16, BF16, BYTES: binary only (no JSON form here)
}

// Appends one JSON number, as a `datatype` element, to `raw`. Empty on
// success, else why not.
std::string AppendNumber(Datatype type, absl::string_view text,
                         std::string* raw) {
  const char* first = text.data();
  const char* last = text.data() + text.size();
  switch (type.element) {
    case Element::kFloat32: {
      // Straight to float (no double rounding); beyond float's range, its
      // nearest float, signed (+-0 or +-inf; the decoder refuses inf,
      // naming the input).
      float value = 0;
      auto [end, error] = std::from_chars(first, last, value);
      if (error == std::errc::result_out_of_range && end == last) {
        value = static_cast<float>(ParseDouble(text).value_or(0));
      } else if (error != std::errc() || end != last) {
        return "not a number";
      }
      raw->append(reinterpret_cast<const char*>(&value), sizeof value);
      return {};
    }
    case Element::kFloat64: {
      const std::optional<double> parsed = ParseDouble(text);
      if (!parsed.has_value()) return "not a number";
      const double value = *parsed;
      raw->append(reinterpret_cast<const char*>(&value), sizeof value);
      return {};
    }
    case Element::kSigned: {
      int64_t value = 0;
      auto [end, error] = std::from_chars(first, last, value);
      const int64_t high =
          type.bytes == 8 ? std::numeric_limits<int64_t>::max()
                          : (int64_t{1} << (8 * type.bytes - 1)) - 1;
      if (error != std::errc() || end != last || value > high ||
          value < -high - 1) {
        return absl::StrCat("not an integer in the range of ",
                            8 * type.bytes, "-bit signed integers");
      }
      raw->append(reinterpret_cast<const char*>(&value), type.bytes);
      return {};
    }
    case Element::kUnsigned: {
      uint64_t value = 0;
      auto [end, error] = std::from_chars(first, last, value);
      const uint64_t high = type.bytes == 8
                                ? std::numeric_limits<uint64_t>::max()
                                : (uint64_t{1} << (8 * type.bytes)) - 1;
      if (error != std::errc() || end != last || value > high) {
        return absl::StrCat("not an integer in the range of ",
                            8 * type.bytes, "-bit unsigned integers");
      }
      raw->append(reinterpret_cast<const char*>(&value), type.bytes);
      return {};
    }
    case Element::kBool:
      return "must be true or false (BOOL)";
    case Element::kNone:
      break;
  }
  return "has no JSON form";
}

// The end of the JSON number (RFC 8259: -?(0|[1-9][0-9]*)(.[0-9]+)?
// ([eE][+-]?[0-9]+)?) that starts at `text`, or nullptr when none starts
// there or when it may lie beyond double's range: longer than 24 characters
// or with an exponent of more than two digits (below 1e122 otherwise).
// RapidJSON refuses some of those ("Number too big to be stored in
// double"), so the data fast path leaves them to it and both paths accept
// and refuse alike. Reads one byte past the number (the text ends in NULs).
char* ScanSafeJsonNumber(char* text) {
  char* p = text;
  if (*p == '-') ++p;
  if (*p == '0') {
    ++p;  // a leading zero stands alone
  } else if (absl::ascii_isdigit(*p)) {
    while (absl::ascii_isdigit(*p)) ++p;
  } else {
    return nullptr;
  }
  if (*p == '.') {
    ++p;
    if (!absl::ascii_isdigit(*p)) return nullptr;
    while (absl::ascii_isdigit(*p)) ++p;
  }
  if (*p == 'e' || *p == 'E') {
    ++p;
    if (*p == '+' || *p == '-') ++p;
    const char* const exponent = p;
    while (absl::ascii_isdigit(*p)) ++p;
    if (p == exponent || p - exponent > 2) return nullptr;
  }
  return p - text > 24 ? nullptr : p;
}

// The JSON number at `text` read as the nearest float, and its end; nullptr
// when none starts there or when it lies beyond float's range (the data
// fast path then leaves it to RapidJSON, whose path rounds it as
// AppendNumber does). std::from_chars scans and converts in one pass, where
// ScanSafeJsonNumber and then from_chars took two; it accepts a superset of
// JSON's grammar, so what JSON refuses and from_chars reads is refused
// here: "inf", "nan", ".5", "-.5", "01", "5." and "5.e3" (from_chars never
// takes a leading '+', a hexadecimal form without chars_format::hex, or an
// exponent without digits). Within float's range a number is far within
// double's, which RapidJSON reads whatever its length. Reads up to `limit`
// (the text ends in NULs).
char* ReadJsonFloat(char* text, char* limit, float* value) {
  const char* const digits = text + (*text == '-');
  if (!absl::ascii_isdigit(digits[0])) return nullptr;
  if (digits[0] == '0' && absl::ascii_isdigit(digits[1])) return nullptr;
  auto [end, error] = std::from_chars(text, limit, *value);
  if (error != std::errc()) return nullptr;
  const char* point = digits + 1;
  while (absl::ascii_isdigit(*point)) ++point;
  if (*point == '.' && !absl::ascii_isdigit(point[1])) return nullptr;
  return text + (end - text);
}

// Elements read by the data fast path, appended to an input's raw bytes a
// block at a time: one std::string::append per element was a tenth of the
// fast path's time. Appends nothing until Flush.
class RawBlockWriter {
 public:
  explicit RawBlockWriter(std::string* raw) : raw_(raw) {}
  RawBlockWriter(const RawBlockWriter&) = delete;
  RawBlockWriter& operator=(const RawBlockWriter&) = delete;

  void Add(float value) {
    if (used_ + sizeof value > sizeof block_) Flush();
    std::memcpy(block_ + used_, &value, sizeof value);
    used_ += sizeof value;
  }
  void Flush() {
    raw_->append(block_, used_);
    used_ = 0;
  }

 private:
  std::string* const raw_;
  char block_[1024];
  size_t used_ = 0;
};

// A JSON scalar as an InferParameter.
std::string ParameterFromNumber(absl::string_view text,
                                InferParameter* parameter) {
  const char* first = text.data();
  const char* last = text.data() + text.size();
  int64_t signed_value = 0;
  if (auto [end, error] = std::from_chars(first, last, signed_value);
      error == std::errc() && end == last) {
    parameter->set_int64_param(signed_value);
    return {};
  }
  uint64_t unsigned_value = 0;
  if (auto [end, error] = std::from_chars(first, last, unsigned_value);
      error == std::errc() && end == last) {
    parameter->set_uint64_param(unsigned_value);
    return {};
  }
  const std::optional<double> value = ParseDouble(text);
  if (!value.has_value()) return "not a number";
  if (!std::isfinite(*value)) return "a number beyond double's range";
  parameter->set_double_param(*value);
  return {};
}

// The SAX handler of an inference request's JSON header. Builds the
// request as it reads; the first error stops the parse (a handler returning
// false) and is kept in error_.
class InferHeaderHandler
    : public rapidjson::BaseReaderHandler<rapidjson::UTF8<>,
                                          InferHeaderHandler> {
 public:
  explicit InferHeaderHandler(RestInferRequest* out) : out_(out) {}

  // The stream being parsed, for the data fast path (ReadNumbers).
  void Attach(InsituCursor* cursor) { cursor_ = cursor; }

  // Where the parse is: the innermost object or array open.
  enum class At {
    kStart,            // before the top-level object
    kTop,              // the request object
    kParameters,       // a parameters object (request's, input's, output's)
    kInputs,           // the inputs array
    kInput,            // one input object
    kShape,            // an input's shape array
    kData,             // an input's data array (any depth)
    kOutputs,          // the outputs array
    kOutput,           // one output object
    kDone,             // after the top-level object
  };

  bool Null() { return Unexpected("null"); }
  bool Bool(bool value) {
    switch (at()) {
      case At::kParameters:
        current_parameters_[key_].set_bool_param(value);
        return true;
      case At::kData:
        if (deferring_) {
          inputs_.back().deferred.emplace_back(value ? "true" : "false", true);
          return true;
        }
        return AppendBool(value);
      default:
        return Unexpected("a boolean");
    }
  }
  bool RawNumber(const char* text, rapidjson::SizeType length, bool) {
    const absl::string_view number(text, length);
    switch (at()) {
      case At::kParameters: {
        const std::string error =
            ParameterFromNumber(number, &current_parameters_[key_]);
        if (!error.empty()) return Fail(Where() + error);
        return true;
      }
      case At::kShape: {
        int64_t dimension = -1;
        auto [end, error] =
            std::from_chars(number.data(), number.data() + number.size(),
                            dimension);
        if (error != std::errc() || end != number.data() + number.size() ||
            dimension < 0) {
          return Fail(absl::StrCat(InputName(),
                                   "shape: each dimension must be a "
                                   "non-negative integer, got ",
                                   number));
        }
        input()->add_shape(dimension);
        return true;
      }
      case At::kData:
        if (deferring_) {
          inputs_.back().deferred.emplace_back(std::string(number), false);
          return true;
        }
        if (std::string error = AppendNumber(input_type_, number, raw_);
            !error.empty()) {
          return ElementError(error);
        }
        ++elements_;
        return true;
      default:
        return Unexpected("a number");
    }
  }
  bool String(const char* text, rapidjson::SizeType length, bool) {
    if (HasSurrogate(text, length)) {
      return Fail(Where() + "a \\u escape of a lone surrogate");
    }
    const std::string value(text, length);
    switch (at()) {
      case At::kTop:
        if (key_ == "id") {
          out_->request.set_id(value);
          return true;
        }
        return Unexpected("a string");
      case At::kParameters:
        current_parameters_[key_].set_string_param(value);
        return true;
      case At::kInput:
        if (key_ == "name") {
          input()->set_name(value);
          return true;
        }
        if (key_ == "datatype") {
          input()->set_datatype(value);
          return true;
        }
        return Unexpected("a string");
      case At::kOutput:
        if (key_ == "name") {
          out_->request.mutable_outputs()->rbegin()->set_name(value);
          return true;
        }
        return Unexpected("a string");
      case At::kData:
        return ElementError(
            "is a string; attnserve's models take numbers (BYTES tensors "
            "are not served)");
      default:
        return Unexpected("a string");
    }
  }
  bool Key(const char* text, rapidjson::SizeType length, bool) {
    if (HasSurrogate(text, length)) {
      return Fail("a field name with a \\u escape of a lone surrogate");
    }
    key_.assign(text, length);
    // A field of the request, an input or an output given twice: the
    // second would silently win (or, for an input's datatype, disagree
    // with data read under the first).
    if (at() == At::kTop || at() == At::kInput || at() == At::kOutput) {
      if (!seen_keys_.back().insert(key_).second) {
        return Fail(absl::StrCat(at() == At::kInput    ? InputName()
                                 : at() == At::kOutput ? "an output: "
                                                       : "",
                                 "field '", key_, "' given twice"));
      }
    }
    return true;
  }
  bool StartObject() {
    if (stack_.size() >= kMaxDepth) return Fail("nesting too deep");
    switch (at()) {
      case At::kStart:
        stack_.push_back(At::kTop);
        seen_keys_.emplace_back();
        return true;
      case At::kTop:
        if (key_ == "parameters") return OpenParameters(At::kTop);
        return Unexpected("an object");
      case At::kInputs:
        out_->request.add_inputs();
        inputs_.emplace_back();
        raw_ = &inputs_.back().raw;
        input_type_ = {};
        elements_ = 0;
        stack_.push_back(At::kInput);
        seen_keys_.emplace_back();
        return true;
      case At::kInput:
        if (key_ == "parameters") return OpenParameters(At::kInput);
        return Unexpected("an object");
      case At::kOutputs:
        out_->request.add_outputs();
        stack_.push_back(At::kOutput);
        seen_keys_.emplace_back();
        return true;
      case At::kOutput:
        if (key_ == "parameters") return OpenParameters(At::kOutput);
        return Unexpected("an object");
      default:
        return Unexpected("an object");
    }
  }
  bool EndObject(rapidjson::SizeType) {
    const At closing = at();
    stack_.pop_back();
    if (closing == At::kTop || closing == At::kInput ||
        closing == At::kOutput) {
      seen_keys_.pop_back();
    }
    switch (closing) {
      case At::kParameters:
        return CloseParameters();
      case At::kInput:
        return CloseInput();
      case At::kTop:
        stack_.push_back(At::kDone);
        return true;
      default:
        return true;
    }
  }
  bool StartArray() {
    if (stack_.size() >= kMaxDepth) {
      return Fail(at() == At::kData
                      ? InputName() + "'data' is nested too deep (at most " +
                            std::to_string(kMaxDepth - 4) + " levels)"
                      : std::string("nesting too deep"));
    }
    switch (at()) {
      case At::kTop:
        if (key_ == "inputs") {
          stack_.push_back(At::kInputs);
          return true;
        }
        if (key_ == "outputs") {
          stack_.push_back(At::kOutputs);
          return true;
        }
        return Unexpected("an array");
      case At::kInput:
        if (key_ == "shape") {
          input()->clear_shape();
          stack_.push_back(At::kShape);
          return true;
        }
        if (key_ == "data") {
          if (has_data()) return Fail(InputName() + "data given twice");
          has_data() = true;
          input_type_ = DatatypeOf(input()->datatype());
          deferring_ = input()->datatype().empty();
          stack_.push_back(At::kData);
          return ReadNumbers();
        }
        return Unexpected("an array");
      case At::kData:
        stack_.push_back(At::kData);  // nested: row-major all the same
        return ReadNumbers();
      default:
        return Unexpected("an array");
    }
  }
  bool EndArray(rapidjson::SizeType) {
    stack_.pop_back();
    return true;
  }

  const std::string& error() const { return error_; }

  // One input's data and framing as read.
  struct InputState {
    std::string raw;          // its raw contents, from JSON data
    bool has_data = false;    // `data` was given
    // The data's elements as text, when `data` came before `datatype`.
    std::vector<std::pair<std::string, bool>> deferred;  // (text, is_bool)
    int64_t elements = 0;     // elements of JSON data read
    std::optional<int64_t> binary_data_size;
  };
  std::vector<InputState>& inputs() { return inputs_; }

 private:
  At at() const { return stack_.empty() ? At::kStart : stack_.back(); }

  static char* SkipSpace(char* p) {
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') ++p;
    return p;
  }

  // The data fast path: called when a data array opens (the cursor at its
  // '['), it reads the run of `number,` ... `number]` that follows straight
  // into raw_, where RapidJSON would scan each number and hand its text to
  // RawNumber (two fifths of the parse of a large tensor). It stops before
  // anything else (a nested array, a boolean, a malformed or very long
  // number, a missing comma, a comma before ']') and leaves that to
  // RapidJSON, so every error, and every other layout, reads as before.
  // False on an element error (error_ set).
  bool ReadNumbers() {
    const Element element = input_type_.element;
    if (cursor_ == nullptr || deferring_ || element == Element::kBool ||
        element == Element::kNone) {
      return true;
    }
    char* const open = cursor_->src_;
    char* consumed = open + 1;  // the '[', then each `number,`
    // FP32, perf_analyzer's JSON tensors and by far the most common, is
    // scanned and converted in one pass and appended a block at a time.
    const bool fp32 = element == Element::kFloat32;
    RawBlockWriter fp32_writer(raw_);
    for (;;) {
      char* const start = SkipSpace(consumed);
      float value = 0;
      char* const end = fp32 ? ReadJsonFloat(start, cursor_->limit_, &value)
                             : ScanSafeJsonNumber(start);
      if (end == nullptr) break;
      // A ',' or ']' must follow, and no ']' the ','.
      char* const next = SkipSpace(end);
      if (*next != ',' && *next != ']') break;
      if (*next == ',' && *SkipSpace(next + 1) == ']') break;
      if (fp32) {
        fp32_writer.Add(value);
      } else if (std::string error = AppendNumber(
                     input_type_, absl::string_view(start, end - start), raw_);
                 !error.empty()) {
        return ElementError(error);
      }
      ++elements_;
      consumed = next + (*next == ',');
      if (*next == ']') break;
    }
    fp32_writer.Flush();
    // RapidJSON takes one byte (the '[' it thinks is next) when this returns.
    cursor_->src_ = consumed - 1;
    return true;
  }
  ModelInferRequest::InferInputTensor* input() {
    return &*out_->request.mutable_inputs()->rbegin();
  }
  bool& has_data() { return inputs_.back().has_data; }
  std::string InputName() {
    return absl::StrCat("input '", input()->name(), "': ");
  }
  bool AppendBool(bool value) {
    if (input_type_.element != Element::kBool) {
      return ElementError(input_type_.element == Element::kNone
                              ? "has no JSON form"
                              : "must be a number");
    }
    raw_->push_back(value ? 1 : 0);
    ++elements_;
    return true;
  }
  bool ElementError(absl::string_view why) {
    return Fail(absl::StrCat(InputName(), "data element ", elements_, " ",
                             why, " (datatype '", input()->datatype(), "')"));
  }
  std::string Where() const {
    return key_.empty() ? std::string() : absl::StrCat("'", key_, "': ");
  }
  bool Unexpected(absl::string_view what) {
    const char* place = "the request";
    switch (at()) {
      case At::kInput: place = "an input"; break;
      case At::kOutput: place = "an output"; break;
      case At::kInputs: place = "inputs"; break;
      case At::kOutputs: place = "outputs"; break;
      case At::kShape: place = "a shape"; break;
      case At::kParameters: place = "parameters"; break;
      default: break;
    }
    if (at() == At::kData || at() == At::kShape) {
      return Fail(absl::StrCat(InputName(), "'",
                               at() == At::kData ? "data" : "shape", "': ",
                               what, " is not allowed (",
                               at() == At::kData ? "numbers or booleans"
                                                 : "non-negative integers",
                               " only)"));
    }
    if (at() == At::kInputs || at() == At::kOutputs || at() == At::kStart) {
      return Fail(absl::StrCat(what, " is not allowed in ", place));
    }
    return Fail(absl::StrCat("field '", key_, "' of ", place, ": ", what,
                             " is not allowed here (the fields are ",
                             FieldsOf(at()), ")"));
  }
  static const char* FieldsOf(At at) {
    switch (at) {
      case At::kTop: return "id, parameters, inputs, outputs";
      case At::kInput: return "name, shape, datatype, parameters, data";
      case At::kOutput: return "name, parameters";
      default: return "bool, number or string values";
    }
  }
  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }

  bool OpenParameters(At owner) {
    parameters_owner_ = owner;
    current_parameters_.clear();
    stack_.push_back(At::kParameters);
    return true;
  }
  // Moves the parameters read into their owner, taking out the binary
  // tensor data extension's own.
  bool CloseParameters() {
    google::protobuf::Map<std::string, InferParameter>* target = nullptr;
    for (auto& [name, parameter] : current_parameters_) {
      if (parameters_owner_ == At::kInput && name == "binary_data_size") {
        if (parameter.parameter_choice_case() != InferParameter::kInt64Param ||
            parameter.int64_param() < 0) {
          return Fail(InputName() +
                      "parameter 'binary_data_size': must be a "
                      "non-negative integer");
        }
        inputs_.back().binary_data_size = parameter.int64_param();
        continue;
      }
      if ((parameters_owner_ == At::kOutput && name == "binary_data") ||
          (parameters_owner_ == At::kTop && name == "binary_data_output")) {
        if (parameter.parameter_choice_case() != InferParameter::kBoolParam) {
          return Fail(absl::StrCat("parameter '", name,
                                   "': must be true or false"));
        }
        if (parameters_owner_ == At::kTop) {
          out_->binary_data_output = parameter.bool_param();
        } else {
          pending_output_binary_.emplace_back(
              out_->request.outputs_size() - 1, parameter.bool_param());
        }
        continue;
      }
      switch (parameters_owner_) {
        case At::kTop:
          target = out_->request.mutable_parameters();
          break;
        case At::kInput:
          target = input()->mutable_parameters();
          break;
        default:
          target =
              out_->request.mutable_outputs()->rbegin()->mutable_parameters();
          break;
      }
      (*target)[name] = std::move(parameter);
    }
    current_parameters_.clear();
    return true;
  }
  // Converts data that came before its datatype.
  bool CloseInput() {
    InputState& state = inputs_.back();
    if (state.has_data && deferring_) {
      input_type_ = DatatypeOf(input()->datatype());
      elements_ = 0;
      for (const auto& [text, is_bool] : state.deferred) {
        if (is_bool) {
          if (!AppendBool(text == "true")) return false;
        } else if (std::string error = AppendNumber(input_type_, text, raw_);
                   !error.empty()) {
          return ElementError(error);
        } else {
          ++elements_;
        }
      }
      state.deferred.clear();
    }
    state.elements = elements_;
    deferring_ = false;
    if (state.has_data && input_type_.element == Element::kNone) {
      return Fail(InputName() + "datatype '" + input()->datatype() +
                  "' has no JSON form; send it as binary data "
                  "(binary_data_size)");
    }
    return true;
  }

 public:
  const std::vector<std::pair<int, bool>>& pending_output_binary() const {
    return pending_output_binary_;
  }

 private:
  // The request, inputs, an input, its data arrays: a tensor of 60
  // dimensions fits; deeper is refused before the parser recurses.
  static constexpr size_t kMaxDepth = 64;

  RestInferRequest* const out_;
  InsituCursor* cursor_ = nullptr;
  std::vector<At> stack_;
  std::vector<std::set<std::string>> seen_keys_;  // per open object
  std::string key_;
  std::map<std::string, InferParameter> current_parameters_;
  At parameters_owner_ = At::kTop;
  std::vector<InputState> inputs_;
  std::string* raw_ = nullptr;
  Datatype input_type_;
  // The current input's data came before its datatype: kept as text
  // (InputState::deferred) until the input's object ends.
  bool deferring_ = false;
  int64_t elements_ = 0;
  std::vector<std::pair<int, bool>> pending_output_binary_;
  std::string error_;
};

// The element count of `shape`, or -1 for a negative dimension or a count
// beyond int64. Not attn::CheckedNumElements: that refuses empty tensors and
// large ones, which the KServe decoder refuses later in its own words; here
// the count only has to match the JSON data's.
int64_t ElementsOf(const google::protobuf::RepeatedField<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t dimension : shape) {
    if (dimension < 0) return -1;
    if (dimension != 0 && count > std::numeric_limits<int64_t>::max() /
                                      dimension) {
      return -1;
    }
    count *= dimension;
  }
  return count;
}

}  // namespace

bool RestInferRequest::Binary(const std::string& output) const {
  auto it = output_binary.find(output);
  return it != output_binary.end() ? it->second : binary_data_output;
}

absl::Status ParseRestInferRequest(absl::string_view model_name,
                                   absl::string_view model_version,
                                   absl::string_view body,
                                   std::optional<uint64_t> json_length,
                                   RestInferRequest* out) {
  *out = RestInferRequest{};
  out->request.set_model_name(std::string(model_name));
  out->request.set_model_version(std::string(model_version));
  absl::string_view json = body;
  absl::string_view binary;
  if (json_length.has_value()) {
    if (*json_length > body.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Inference-Header-Content-Length: ", *json_length,
          " bytes of JSON header, but the body has only ", body.size()));
    }
    json = body.substr(0, *json_length);
    binary = body.substr(*json_length);
  }
  if (json.empty()) {
    return absl::InvalidArgumentError(
        "the request body is empty; expected a JSON object with 'inputs'");
  }
  InferHeaderHandler handler(out);
  if (absl::Status status = ParseJson(json, &handler, "the request body");
      !status.ok()) {
    return status;
  }
  // Each input's raw contents: its JSON data or its part of the binary
  // section, in input order.
  size_t offset = 0;
  std::vector<InferHeaderHandler::InputState>& inputs = handler.inputs();
  for (int i = 0; i < out->request.inputs_size(); ++i) {
    auto* input = out->request.mutable_inputs(i);
    InferHeaderHandler::InputState& state = inputs[i];
    const std::string field = absl::StrCat("input '", input->name(), "': ");
    if (input->name().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", i, ": 'name' is required"));
    }
    if (input->datatype().empty()) {
      return absl::InvalidArgumentError(field + "'datatype' is required");
    }
    if (state.binary_data_size.has_value()) {
      if (state.has_data) {
        return absl::InvalidArgumentError(
            field + "both 'data' and parameter 'binary_data_size' given");
      }
      const uint64_t size = static_cast<uint64_t>(*state.binary_data_size);
      if (size > binary.size() - offset) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, "binary_data_size ", size, " runs past the body: ",
            binary.size() - offset, " bytes of the binary section are left"));
      }
      out->request.add_raw_input_contents(
          std::string(binary.substr(offset, size)));
      offset += size;
      continue;
    }
    if (!state.has_data) {
      return absl::InvalidArgumentError(
          field + "no 'data' and no parameter 'binary_data_size'");
    }
    const int64_t expected = ElementsOf(input->shape());
    if (expected < 0 || state.elements != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "shape [", absl::StrJoin(input->shape(), ","), "] has ",
          expected < 0 ? std::string("too many") : absl::StrCat(expected),
          " elements, but 'data' has ", state.elements));
    }
    out->request.add_raw_input_contents(std::move(state.raw));
  }
  if (offset != binary.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the binary section has ", binary.size(), " bytes, but the inputs' ",
        "binary_data_size add up to ", offset));
  }
  for (const auto& [index, binary_output] : handler.pending_output_binary()) {
    out->output_binary[out->request.outputs(index).name()] = binary_output;
  }
  return absl::OkStatus();
}

}  // namespace attnserve
