#include "client/printer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "attention/v1/attention.pb.h"
#include "client/tensors.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "google/protobuf/util/json_util.h"

namespace attnctl {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// --- The full form.

absl::StatusOr<std::string> FullJson(const PrintOptions& options,
                                     Message* response) {
  if (!options.keep_raw) {
    ForEachTensor(response, [](const std::string& /*path*/,
                               attention::v1::Tensor* tensor) {
      // A malformed tensor stays raw, as documented.
      Reencode(attention::v1::TENSOR_ENCODING_VALUES, tensor).IgnoreError();
    });
  }
  google::protobuf::util::JsonPrintOptions json_options;
  json_options.preserve_proto_field_names = true;
  json_options.always_print_primitive_fields = false;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(
      *response, &json, json_options);
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot print the response as JSON: ", status.ToString()));
  }
  return json;
}

// --- The summary form: a small JSON writer that walks the message by
// reflection, so it can put statistics where big arrays were.

// A JSON number, or protobuf's strings for the values JSON lacks.
template <typename Float>
void AppendNumber(Float value, std::string* out) {
  if (std::isnan(value)) {
    out->append("\"NaN\"");
  } else if (std::isinf(value)) {
    out->append(value > 0 ? "\"Infinity\"" : "\"-Infinity\"");
  } else {
    char buffer[64];
    // The shortest text that reads back as the same Float.
    const std::to_chars_result result =
        std::to_chars(buffer, buffer + sizeof(buffer), value);
    out->append(buffer, result.ptr);
  }
}

void AppendString(absl::string_view text, std::string* out) {
  out->push_back('"');
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(out, "\\u%04x", static_cast<unsigned char>(c));
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

// `"count": n, "min": ..., "max": ..., "mean": ...` over the finite elements,
// each printed as a Number (the mean is accumulated in double).
template <typename Number>
void AppendStatistics(const std::vector<Number>& elements, std::string* out) {
  Number min = std::numeric_limits<Number>::infinity();
  Number max = -min;
  double sum = 0;
  int64_t finite = 0;
  for (const Number element : elements) {
    if (!std::isfinite(element)) continue;
    min = std::min(min, element);
    max = std::max(max, element);
    sum += element;
    ++finite;
  }
  absl::StrAppend(out, "\"count\":", elements.size());
  if (finite > 0) {
    out->append(",\"min\":");
    AppendNumber(min, out);
    out->append(",\"max\":");
    AppendNumber(max, out);
    out->append(",\"mean\":");
    AppendNumber(static_cast<Number>(sum / finite), out);
  }
  if (finite < static_cast<int64_t>(elements.size())) {
    absl::StrAppend(out, ",\"non_finite\":", elements.size() - finite);
  }
}

// A list in full when short, else its statistics.
template <typename Number>
void AppendNumbers(const std::vector<Number>& elements, std::string* out) {
  if (elements.size() > kSummaryMaxElements) {
    out->push_back('{');
    AppendStatistics(elements, out);
    out->push_back('}');
    return;
  }
  out->push_back('[');
  for (size_t i = 0; i < elements.size(); ++i) {
    if (i > 0) out->push_back(',');
    AppendNumber(elements[i], out);
  }
  out->push_back(']');
}

void AppendTensorSummary(const attention::v1::Tensor& tensor,
                         std::string* out) {
  absl::StrAppend(out, "{\"shape\":[", absl::StrJoin(tensor.shape(), ","), "]");
  absl::StatusOr<std::vector<float>> elements = ReadElements(tensor);
  if (!elements.ok()) {
    absl::StrAppend(out, ",\"raw_bytes\":", tensor.raw().size(), "}");
    return;
  }
  if (elements->size() > kSummaryMaxElements) {
    out->push_back(',');
    AppendStatistics(*elements, out);
  } else {
    out->append(",\"values\":");
    AppendNumbers(*elements, out);
  }
  out->push_back('}');
}

void AppendMessageSummary(const Message& message, std::string* out);

// Element `index` of a repeated field, or the singular field when index < 0.
void AppendFieldValue(const Message& message, const FieldDescriptor* field,
                      int index, std::string* out) {
  const Reflection* reflection = message.GetReflection();
  const bool repeated = index >= 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      absl::StrAppend(
          out, repeated ? reflection->GetRepeatedInt32(message, field, index)
                        : reflection->GetInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      absl::StrAppend(
          out, repeated ? reflection->GetRepeatedInt64(message, field, index)
                        : reflection->GetInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      absl::StrAppend(
          out, repeated ? reflection->GetRepeatedUInt32(message, field, index)
                        : reflection->GetUInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      absl::StrAppend(
          out, repeated ? reflection->GetRepeatedUInt64(message, field, index)
                        : reflection->GetUInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      AppendNumber(repeated
                       ? reflection->GetRepeatedFloat(message, field, index)
                       : reflection->GetFloat(message, field),
                   out);
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      AppendNumber(repeated
                       ? reflection->GetRepeatedDouble(message, field, index)
                       : reflection->GetDouble(message, field),
                   out);
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      out->append((repeated ? reflection->GetRepeatedBool(message, field, index)
                            : reflection->GetBool(message, field))
                      ? "true"
                      : "false");
      break;
    case FieldDescriptor::CPPTYPE_ENUM: {
      const int number =
          repeated ? reflection->GetRepeatedEnumValue(message, field, index)
                   : reflection->GetEnumValue(message, field);
      const google::protobuf::EnumValueDescriptor* value =
          field->enum_type()->FindValueByNumber(number);
      if (value != nullptr) {
        AppendString(value->name(), out);
      } else {
        absl::StrAppend(out, number);
      }
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string text =
          repeated ? reflection->GetRepeatedString(message, field, index)
                   : reflection->GetString(message, field);
      AppendString(field->type() == FieldDescriptor::TYPE_BYTES
                       ? absl::Base64Escape(text)
                       : text,
                   out);
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE: {
      const Message& child =
          repeated ? reflection->GetRepeatedMessage(message, field, index)
                   : reflection->GetMessage(message, field);
      if (const auto* tensor =
              google::protobuf::DynamicCastToGenerated<attention::v1::Tensor>(
                  &child)) {
        AppendTensorSummary(*tensor, out);
      } else {
        AppendMessageSummary(child, out);
      }
      break;
    }
  }
}

// A repeated float or double field, summarized when long.
template <typename Float>
void AppendRepeatedFloats(
    const google::protobuf::RepeatedFieldRef<Float>& field, std::string* out) {
  AppendNumbers(std::vector<Float>(field.begin(), field.end()), out);
}

void AppendMessageSummary(const Message& message, std::string* out) {
  const Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  out->push_back('{');
  for (size_t f = 0; f < fields.size(); ++f) {
    const FieldDescriptor* field = fields[f];
    if (f > 0) out->push_back(',');
    AppendString(field->name(), out);
    out->push_back(':');
    if (!field->is_repeated()) {
      AppendFieldValue(message, field, -1, out);
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT) {
      AppendRepeatedFloats(
          reflection->GetRepeatedFieldRef<float>(message, field), out);
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
      AppendRepeatedFloats(
          reflection->GetRepeatedFieldRef<double>(message, field), out);
    } else {
      out->push_back('[');
      for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
        if (i > 0) out->push_back(',');
        AppendFieldValue(message, field, i, out);
      }
      out->push_back(']');
    }
  }
  out->push_back('}');
}

}  // namespace

absl::StatusOr<std::string> FormatResponse(const PrintOptions& options,
                                           Message* response) {
  if (!options.summary) return FullJson(options, response);
  std::string json;
  AppendMessageSummary(*response, &json);
  return json;
}

}  // namespace attnctl
