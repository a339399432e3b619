#include "server/kserve/rest_json.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "server/kserve/rest.h"
#include "server/transport/rest_call.h"

namespace attnserve {

// Whether decoded text holds a UTF-16 surrogate (ED A0..BF in UTF-8):
// RapidJSON 1.1 decodes a lone low-surrogate escape (\udc00) into one, which
// is not UTF-8 and would make every echo of the text invalid JSON.
bool HasSurrogate(const char* text, size_t length) {
  for (size_t i = 0; i + 1 < length; ++i) {
    if (static_cast<unsigned char>(text[i]) == 0xED &&
        static_cast<unsigned char>(text[i + 1]) >= 0xA0) {
      return true;
    }
  }
  return false;
}

// A whole JSON number as the nearest double, beyond double's range too
// (then +-inf, or +-0 and subnormals below it, signed: std::from_chars
// refuses those with result_out_of_range and leaves its value unset, so
// strtod rounds them; the server's locale is "C"). nullopt when `text` is
// not a number.
std::optional<double> ParseDouble(absl::string_view text) {
  double value = 0;
  auto [end, error] =
      std::from_chars(text.data(), text.data() + text.size(), value);
  if (end != text.data() + text.size()) return std::nullopt;
  if (error == std::errc()) return value;
  if (error == std::errc::result_out_of_range) {
    return std::strtod(std::string(text).c_str(), nullptr);
  }
  return std::nullopt;
}

namespace {

void AppendMessage(const google::protobuf::Message& message, std::string* out);

void AppendScalar(const google::protobuf::Message& message,
                  const google::protobuf::FieldDescriptor* field, int index,
                  std::string* out) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* reflection = message.GetReflection();
  const bool repeated = field->is_repeated();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      absl::StrAppend(out, repeated ? reflection->GetRepeatedInt32(message, field, index)
                                    : reflection->GetInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      absl::StrAppend(out, repeated ? reflection->GetRepeatedInt64(message, field, index)
                                    : reflection->GetInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      absl::StrAppend(out, repeated ? reflection->GetRepeatedUInt32(message, field, index)
                                    : reflection->GetUInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      absl::StrAppend(out, repeated ? reflection->GetRepeatedUInt64(message, field, index)
                                    : reflection->GetUInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      const double value =
          field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE
              ? (repeated ? reflection->GetRepeatedDouble(message, field, index)
                          : reflection->GetDouble(message, field))
              : (repeated ? reflection->GetRepeatedFloat(message, field, index)
                          : reflection->GetFloat(message, field));
      char buffer[32];
      auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
      out->append(std::isfinite(value) && error == std::errc()
                      ? std::string(buffer, end)
                      : "null");
      break;
    }
    case FieldDescriptor::CPPTYPE_BOOL:
      out->append((repeated ? reflection->GetRepeatedBool(message, field, index)
                            : reflection->GetBool(message, field))
                      ? "true"
                      : "false");
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      AppendJsonString(
          (repeated ? reflection->GetRepeatedEnum(message, field, index)
                    : reflection->GetEnum(message, field))
              ->name(),
          out);
      break;
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string value =
          repeated ? reflection->GetRepeatedString(message, field, index)
                   : reflection->GetString(message, field);
      AppendJsonString(field->type() == FieldDescriptor::TYPE_BYTES
                           ? absl::Base64Escape(value)
                           : value,
                       out);
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      AppendMessage(repeated ? reflection->GetRepeatedMessage(message, field, index)
                             : reflection->GetMessage(message, field),
                    out);
      break;
  }
}

void AppendMessage(const google::protobuf::Message& message, std::string* out) {
  const google::protobuf::Reflection* reflection = message.GetReflection();
  // The fields set, and every plain scalar at its default too (as Triton
  // writes statistics: a count of 0 is there to read).
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  const google::protobuf::Descriptor* descriptor = message.GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    const bool plain_scalar =
        !field->is_repeated() && field->containing_oneof() == nullptr &&
        field->cpp_type() !=
            google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE;
    if (plain_scalar || (field->is_repeated()
                             ? reflection->FieldSize(message, field) > 0
                             : reflection->HasField(message, field))) {
      fields.push_back(field);
    }
  }
  out->push_back('{');
  bool first = true;
  for (const auto* field : fields) {
    if (!first) out->push_back(',');
    first = false;
    AppendJsonString(field->name(), out);
    out->push_back(':');
    if (field->is_map()) {
      // A map is a repeated entry message of key and value.
      out->push_back('{');
      const int size = reflection->FieldSize(message, field);
      for (int i = 0; i < size; ++i) {
        const google::protobuf::Message& entry =
            reflection->GetRepeatedMessage(message, field, i);
        const auto* key = entry.GetDescriptor()->FindFieldByNumber(1);
        const auto* value = entry.GetDescriptor()->FindFieldByNumber(2);
        if (i > 0) out->push_back(',');
        std::string key_text;
        AppendScalar(entry, key, 0, &key_text);
        if (key_text.empty() || key_text.front() != '"') {
          key_text = absl::StrCat("\"", key_text, "\"");
        }
        out->append(key_text);
        out->push_back(':');
        AppendScalar(entry, value, 0, out);
      }
      out->push_back('}');
    } else if (field->is_repeated()) {
      out->push_back('[');
      const int size = reflection->FieldSize(message, field);
      for (int i = 0; i < size; ++i) {
        if (i > 0) out->push_back(',');
        AppendScalar(message, field, i, out);
      }
      out->push_back(']');
    } else {
      AppendScalar(message, field, 0, out);
    }
  }
  out->push_back('}');
}

}  // namespace

std::string MessageToRestJson(const google::protobuf::Message& message) {
  std::string out;
  AppendMessage(message, &out);
  return out;
}

}  // namespace attnserve
