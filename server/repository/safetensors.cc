#include "server/repository/safetensors.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "attn/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace attnserve {
namespace {

// A JSON number that must be a count (a dimension, a byte offset): JSON
// has only doubles, so 20.5, -1 and 1e30 parse too; each is refused rather
// than cast (a cast truncates, and one past int64 is undefined).
absl::StatusOr<int64_t> JsonCount(absl::string_view field,
                                  const google::protobuf::Value& value) {
  constexpr double kLargest = 9007199254740992.0;  // 2^53: exact in a double
  const double number = value.number_value();
  if (value.kind_case() != google::protobuf::Value::kNumberValue ||
      !(number >= 0.0 && number <= kLargest) || std::floor(number) != number) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors: ", field, " must hold whole numbers in [0, 2^53], got ",
        value.kind_case() == google::protobuf::Value::kNumberValue
            ? absl::StrCat(number)
            : std::string("a non-number")));
  }
  return static_cast<int64_t>(number);
}

}  // namespace

absl::StatusOr<std::map<std::string, attn::Tensor>> ParseSafetensors(
    const std::string& bytes) {
  if (bytes.size() < 8) {
    return absl::InvalidArgumentError("safetensors: shorter than its header");
  }
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  if (header_size > bytes.size() - 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors: header of ", header_size, " bytes runs past the file"));
  }
  google::protobuf::Struct header;
  if (!google::protobuf::util::JsonStringToMessage(
           bytes.substr(8, header_size), &header)
           .ok()) {
    return absl::InvalidArgumentError("safetensors: the header is not JSON");
  }
  const size_t data_begin = 8 + header_size;
  const size_t data_size = bytes.size() - data_begin;
  std::map<std::string, attn::Tensor> tensors;
  for (const auto& [name, value] : header.fields()) {
    if (name == "__metadata__") continue;
    const auto& fields = value.struct_value().fields();
    auto dtype = fields.find("dtype");
    auto shape = fields.find("shape");
    auto offsets = fields.find("data_offsets");
    if (dtype == fields.end() || shape == fields.end() || offsets == fields.end() ||
        offsets->second.list_value().values_size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: tensor '", name, "' lacks dtype, shape or data_offsets"));
    }
    if (dtype->second.string_value() != "F32") {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: tensor '", name, "' is ", dtype->second.string_value(),
          "; only F32 is served"));
    }
    attn::Tensor tensor;
    for (const auto& dim : shape->second.list_value().values()) {
      ASSIGN_OR_RETURN(const int64_t size,
                       JsonCount(absl::StrCat("tensor '", name, "' shape"), dim));
      tensor.shape.push_back(size);
    }
    ASSIGN_OR_RETURN(const int64_t count,
                     attn::CheckedNumElements(name, tensor.shape));
    const std::string offsets_field =
        absl::StrCat("tensor '", name, "' data_offsets");
    ASSIGN_OR_RETURN(const int64_t begin,
                     JsonCount(offsets_field,
                               offsets->second.list_value().values(0)));
    ASSIGN_OR_RETURN(const int64_t end,
                     JsonCount(offsets_field,
                               offsets->second.list_value().values(1)));
    if (end > static_cast<int64_t>(data_size) || end - begin != 4 * count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: tensor '", name, "' data_offsets [", begin, ", ", end,
          ") do not hold ", count, " float32 values inside the ", data_size,
          "-byte data"));
    }
    tensor.data.resize(count);
    std::memcpy(tensor.data.data(),
                bytes.data() + data_begin + static_cast<size_t>(begin), 4 * count);
    tensors[name] = std::move(tensor);
  }
  return tensors;
}

std::string SerializeSafetensors(
    const std::map<std::string, attn::Tensor>& tensors) {
  std::string header = "{";
  std::string data;
  for (const auto& [name, tensor] : tensors) {
    if (header.size() > 1) header += ",";
    std::string shape;
    for (int64_t dim : tensor.shape) {
      absl::StrAppend(&shape, shape.empty() ? "" : ",", dim);
    }
    absl::StrAppend(&header, "\"", name, "\":{\"dtype\":\"F32\",\"shape\":[",
                    shape, "],\"data_offsets\":[", data.size(), ",",
                    data.size() + 4 * tensor.data.size(), "]}");
    data.append(reinterpret_cast<const char*>(tensor.data.data()),
                4 * tensor.data.size());
  }
  header += "}";
  while (header.size() % 8 != 0) header += " ";  // the format's alignment
  const uint64_t size = header.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &size, 8);
  return bytes + header + data;
}

}  // namespace attnserve
