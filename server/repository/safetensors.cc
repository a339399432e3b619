#include "server/repository/safetensors.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "attn/status_macros.h"
#include "rapidjson/document.h"
#include "rapidjson/memorystream.h"
#include "rapidjson/reader.h"

namespace attnserve {
namespace {

// The header is read with RapidJSON, not protobuf's Struct: a Struct filled
// by the shared protobuf library cannot be read by code built with
// -fsanitize=thread (its map fields differ in layout there), and the
// sanitizer runs read models too.
using JsonValue = rapidjson::Value;

// A JSON number that must be a count (a dimension, a byte offset): JSON
// has only doubles, so 20.5, -1 and 1e30 parse too; each is refused rather
// than cast (a cast truncates, and one past int64 is undefined).
absl::StatusOr<int64_t> JsonCount(absl::string_view field,
                                  const JsonValue& value) {
  constexpr double kLargest = 9007199254740992.0;  // 2^53: exact in a double
  const double number = value.IsNumber() ? value.GetDouble() : 0.0;
  if (!value.IsNumber() || !(number >= 0.0 && number <= kLargest) ||
      std::floor(number) != number) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors: ", field, " must hold whole numbers in [0, 2^53], got ",
        value.IsNumber() ? absl::StrCat(number) : std::string("a non-number")));
  }
  return static_cast<int64_t>(number);
}

// `text` as the contents of a JSON string (quotes, backslashes and control
// characters escaped).
std::string JsonEscaped(absl::string_view text) {
  std::string out;
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x",
                    static_cast<unsigned>(c));
      out += escaped;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// A string holding a UTF-16 surrogate (a lone one from a \\u escape, which
// RapidJSON passes through): its UTF-8 form starts 0xED 0xA0-0xBF.
bool HasSurrogate(const char* text, size_t length) {
  for (size_t i = 0; i + 1 < length; ++i) {
    if (static_cast<unsigned char>(text[i]) == 0xED &&
        static_cast<unsigned char>(text[i + 1]) >= 0xA0) {
      return true;
    }
  }
  return false;
}

// The header as strict JSON: at most kMaxDepth levels deep, no key twice in
// one object, no surrogates in any string. Walked with a stack, never
// recursion (a header may nest a million levels).
bool StrictJson(const JsonValue& root) {
  constexpr int kMaxDepth = 64;
  std::vector<std::pair<const JsonValue*, int>> pending = {{&root, 1}};
  while (!pending.empty()) {
    const auto [value, depth] = pending.back();
    pending.pop_back();
    if (depth > kMaxDepth) return false;
    if (value->IsString() &&
        HasSurrogate(value->GetString(), value->GetStringLength())) {
      return false;
    }
    if (value->IsArray()) {
      for (const JsonValue& element : value->GetArray()) {
        pending.push_back({&element, depth + 1});
      }
    } else if (value->IsObject()) {
      std::set<absl::string_view> keys;
      for (const auto& member : value->GetObject()) {
        const absl::string_view key(member.name.GetString(),
                                    member.name.GetStringLength());
        if (!keys.insert(key).second ||
            HasSurrogate(key.data(), key.size())) {
          return false;
        }
        pending.push_back({&member.value, depth + 1});
      }
    }
  }
  return true;
}

// Builds the header's document: RapidJSON's iterative reader (no recursion
// however deep the nesting), every number read by strtod as protobuf's and
// the REST reader's are (RapidJSON's full-precision conversion has undefined
// behaviour on some inputs, e.g. long runs of zeros).
struct HeaderReader {
  const char* text;
  size_t size;
  bool ok = false;

  // Forwards to the document, numbers converted here.
  struct Handler {
    rapidjson::Document& document;
    bool Null() { return document.Null(); }
    bool Bool(bool value) { return document.Bool(value); }
    bool Int(int value) { return document.Int(value); }
    bool Uint(unsigned value) { return document.Uint(value); }
    bool Int64(int64_t value) { return document.Int64(value); }
    bool Uint64(uint64_t value) { return document.Uint64(value); }
    bool Double(double value) { return document.Double(value); }
    bool RawNumber(const char* number, rapidjson::SizeType length, bool) {
      const std::string copy(number, length);
      return document.Double(std::strtod(copy.c_str(), nullptr));
    }
    bool String(const char* value, rapidjson::SizeType length, bool copy) {
      return document.String(value, length, copy);
    }
    bool StartObject() { return document.StartObject(); }
    bool Key(const char* value, rapidjson::SizeType length, bool copy) {
      return document.Key(value, length, copy);
    }
    bool EndObject(rapidjson::SizeType members) {
      return document.EndObject(members);
    }
    bool StartArray() { return document.StartArray(); }
    bool EndArray(rapidjson::SizeType elements) {
      return document.EndArray(elements);
    }
  };

  bool operator()(rapidjson::Document& document) {
    Handler handler{document};
    // Read from the bytes as they are: RapidJSON's UTF-8 stream over memory
    // skips each byte of a byte-order mark alone (so a lone 0xBB before
    // the '{' passed, found by fuzz/safetensors), and JSON has no BOM.
    rapidjson::MemoryStream stream(text, size);
    rapidjson::Reader reader;
    ok = !reader
              .Parse<rapidjson::kParseNumbersAsStringsFlag |
                     rapidjson::kParseValidateEncodingFlag |
                     rapidjson::kParseIterativeFlag>(stream, handler)
              .IsError();
    return ok;
  }
};

}  // namespace

namespace {

// The file's JSON header, checked to be an object of strict JSON lying
// inside the file, and where its data begins; INVALID_ARGUMENT otherwise.
absl::Status ParseHeader(absl::string_view bytes, rapidjson::Document* header,
                         size_t* data_begin) {
  if (bytes.size() < 8) {
    return absl::InvalidArgumentError("safetensors: shorter than its header");
  }
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  if (header_size > bytes.size() - 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors: header of ", header_size, " bytes runs past the file"));
  }
  // RapidJSON takes a NUL for the end of its input: one inside the header
  // (never valid JSON) would hide what follows it.
  if (std::memchr(bytes.data() + 8, '\0', header_size) != nullptr) {
    return absl::InvalidArgumentError("safetensors: the header is not JSON");
  }
  HeaderReader reader{bytes.data() + 8, header_size};
  header->Populate(reader);
  if (!reader.ok || !header->IsObject() || !StrictJson(*header)) {
    return absl::InvalidArgumentError("safetensors: the header is not JSON");
  }
  *data_begin = 8 + header_size;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::map<std::string, SafetensorsEntry>> ParseSafetensorsIndex(
    absl::string_view bytes) {
  rapidjson::Document header;
  size_t data_begin = 0;
  RETURN_IF_ERROR(ParseHeader(bytes, &header, &data_begin));
  const size_t data_size = bytes.size() - data_begin;
  std::map<std::string, SafetensorsEntry> tensors;
  for (const auto& member : header.GetObject()) {
    const std::string name(member.name.GetString(),
                           member.name.GetStringLength());
    if (name == "__metadata__") continue;
    const JsonValue& value = member.value;
    auto field = [&](const char* key) -> const JsonValue* {
      if (!value.IsObject()) return nullptr;
      auto it = value.FindMember(key);
      return it == value.MemberEnd() ? nullptr : &it->value;
    };
    const JsonValue* dtype = field("dtype");
    const JsonValue* shape = field("shape");
    const JsonValue* offsets = field("data_offsets");
    if (dtype == nullptr || shape == nullptr || offsets == nullptr ||
        !offsets->IsArray() || offsets->Size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: tensor '", name, "' lacks dtype, shape or data_offsets"));
    }
    const std::string type =
        dtype->IsString()
            ? std::string(dtype->GetString(), dtype->GetStringLength())
            : std::string();
    if (type != "F32" && type != "BF16") {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: tensor '", name, "' is ", type,
          "; only F32 and BF16 are served"));
    }
    SafetensorsEntry tensor;
    tensor.bfloat16 = type == "BF16";
    const int64_t element_bytes = tensor.bfloat16 ? 2 : 4;
    if (shape->IsArray()) {
      for (const JsonValue& dim : shape->GetArray()) {
        ASSIGN_OR_RETURN(const int64_t size,
                         JsonCount(absl::StrCat("tensor '", name, "' shape"),
                                   dim));
        tensor.shape.push_back(size);
      }
    }
    ASSIGN_OR_RETURN(const int64_t count,
                     attn::CheckedNumElements(name, tensor.shape));
    const std::string offsets_field =
        absl::StrCat("tensor '", name, "' data_offsets");
    ASSIGN_OR_RETURN(const int64_t begin,
                     JsonCount(offsets_field, (*offsets)[0]));
    ASSIGN_OR_RETURN(const int64_t end, JsonCount(offsets_field, (*offsets)[1]));
    if (end > static_cast<int64_t>(data_size) ||
        end - begin != element_bytes * count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: tensor '", name, "' data_offsets [", begin, ", ", end,
          ") do not hold ", count, tensor.bfloat16 ? " bfloat16" : " float32",
          " values inside the ", data_size, "-byte data"));
    }
    tensor.offset = data_begin + static_cast<size_t>(begin);
    tensors[name] = std::move(tensor);
  }
  return tensors;
}

absl::StatusOr<SafetensorsMetadata> ParseSafetensorsMetadata(
    absl::string_view bytes) {
  rapidjson::Document header;
  size_t data_begin = 0;
  RETURN_IF_ERROR(ParseHeader(bytes, &header, &data_begin));
  SafetensorsMetadata metadata;
  auto it = header.FindMember("__metadata__");
  if (it == header.MemberEnd()) return metadata;
  if (!it->value.IsObject()) {
    return absl::InvalidArgumentError(
        "safetensors: __metadata__ is not an object");
  }
  for (const auto& member : it->value.GetObject()) {
    const std::string key(member.name.GetString(),
                          member.name.GetStringLength());
    if (!member.value.IsString()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: __metadata__ '", key, "' is not a string"));
    }
    metadata[key] = std::string(member.value.GetString(),
                                member.value.GetStringLength());
  }
  return metadata;
}

absl::StatusOr<std::map<std::string, attn::Tensor>> ParseSafetensors(
    absl::string_view bytes) {
  ASSIGN_OR_RETURN(auto index, ParseSafetensorsIndex(bytes));
  std::map<std::string, attn::Tensor> tensors;
  for (auto& [name, entry] : index) {
    if (entry.bfloat16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: tensor '", name, "' is BF16; only F32 is read here"));
    }
    attn::Tensor tensor = attn::Tensor::Uninitialized(std::move(entry.shape));
    std::memcpy(tensor.data.data(), bytes.data() + entry.offset,
                sizeof(float) * tensor.data.size());
    tensors[name] = std::move(tensor);
  }
  return tensors;
}

absl::StatusOr<std::map<std::string, StoredTensor>> ParseSafetensorsShared(
    std::shared_ptr<const FileBytes> file) {
  const absl::string_view bytes = file->bytes();
  ASSIGN_OR_RETURN(auto index, ParseSafetensorsIndex(bytes));
  std::map<std::string, StoredTensor> tensors;
  for (auto& [name, entry] : index) {
    const size_t element_bytes = entry.bfloat16 ? 2 : 4;
    const size_t size =
        element_bytes * attn::TensorView{nullptr, entry.shape}.num_elements();
    const char* values = bytes.data() + entry.offset;
    std::shared_ptr<const void> owner = file;
    if (reinterpret_cast<uintptr_t>(values) % element_bytes != 0) {
      // The format allows any header length: views would be misaligned.
      auto copy = std::make_shared<std::vector<float>>((size + 3) / 4);
      std::memcpy(copy->data(), values, size);
      values = reinterpret_cast<const char*>(copy->data());
      owner = std::move(copy);
    }
    tensors[name] =
        entry.bfloat16
            ? StoredTensor(std::move(entry.shape),
                           reinterpret_cast<const uint16_t*>(values),
                           std::move(owner))
            : StoredTensor(std::move(entry.shape),
                           reinterpret_cast<const float*>(values),
                           std::move(owner));
  }
  return tensors;
}

namespace {

// A tensor's dtype and its values' bytes.
const char* DtypeOf(const attn::Tensor&) { return "F32"; }
const char* DtypeOf(const StoredTensor& tensor) {
  return tensor.is_bfloat16() ? "BF16" : "F32";
}
absl::string_view BytesOf(const attn::Tensor& tensor) {
  return {reinterpret_cast<const char*>(tensor.data.data()),
          sizeof(float) * tensor.data.size()};
}
// A tensor's size in bytes.
uint64_t SizeOf(const attn::Tensor& tensor) {
  return sizeof(float) * tensor.data.size();
}
uint64_t SizeOf(const StoredTensor& tensor) { return tensor.byte_size(); }
// Calls `write` on each contiguous run of a tensor's bytes, in order.
absl::Status WriteBytes(const attn::Tensor& tensor,
                        absl::FunctionRef<absl::Status(absl::string_view)> write) {
  return write(BytesOf(tensor));
}
absl::Status WriteBytes(const StoredTensor& tensor,
                        absl::FunctionRef<absl::Status(absl::string_view)> write) {
  for (const StoredTensor& part : tensor.parts()) {
    if (absl::Status status = write(part.bytes()); !status.ok()) return status;
  }
  return absl::OkStatus();
}

// F32 tensors first, then BF16 ones: after the header (8-byte aligned),
// every value then lies on its own type's boundary, with the data left
// contiguous as the format's other readers require.
// The 8-byte length and the JSON header (padded to 8 bytes) of `tensors`
// in that order, and the data's size.
template <typename TensorMap>
std::string HeadOf(const TensorMap& tensors, const SafetensorsMetadata& metadata,
                   uint64_t* data_size) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (const auto& [key, value] : metadata) {
      if (header.back() != '{') header += ",";
      absl::StrAppend(&header, "\"", JsonEscaped(key), "\":\"",
                      JsonEscaped(value), "\"");
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (const char* dtype : {"F32", "BF16"}) {
    for (const auto& [name, tensor] : tensors) {
      if (std::strcmp(DtypeOf(tensor), dtype) != 0) continue;
      if (header.back() != '{') header += ",";
      std::string shape;
      for (int64_t dim : tensor.shape) {
        absl::StrAppend(&shape, shape.empty() ? "" : ",", dim);
      }
      const uint64_t size = SizeOf(tensor);
      absl::StrAppend(&header, "\"", JsonEscaped(name), "\":{\"dtype\":\"",
                      dtype, "\",\"shape\":[", shape, "],\"data_offsets\":[",
                      offset, ",", offset + size, "]}");
      offset += size;
    }
  }
  header += "}";
  while (header.size() % 8 != 0) header += " ";  // the format's alignment
  const uint64_t size = header.size();
  std::string head(8, '\0');
  std::memcpy(head.data(), &size, 8);
  *data_size = offset;
  return head + header;
}

template <typename TensorMap>
absl::Status WriteInPieces(
    const TensorMap& tensors, const SafetensorsMetadata& metadata,
    absl::FunctionRef<absl::Status(absl::string_view)> write) {
  uint64_t data_size = 0;
  if (absl::Status status = write(HeadOf(tensors, metadata, &data_size));
      !status.ok()) {
    return status;
  }
  for (const char* dtype : {"F32", "BF16"}) {
    for (const auto& [name, tensor] : tensors) {
      if (std::strcmp(DtypeOf(tensor), dtype) != 0) continue;
      absl::Status status =
          WriteBytes(tensor, [&](absl::string_view bytes) {
            for (size_t at = 0; at < bytes.size(); at += kSafetensorsPiece) {
              if (absl::Status written =
                      write(bytes.substr(at, kSafetensorsPiece));
                  !written.ok()) {
                return written;
              }
            }
            return absl::OkStatus();
          });
      if (!status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

template <typename TensorMap>
std::string Serialize(const TensorMap& tensors) {
  std::string bytes;
  uint64_t data_size = 0;
  bytes.reserve(HeadOf(tensors, {}, &data_size).size() + data_size);
  WriteInPieces(tensors, {}, [&](absl::string_view piece) {
    bytes.append(piece.data(), piece.size());
    return absl::OkStatus();
  }).IgnoreError();  // appending to a string does not fail
  return bytes;
}

}  // namespace

std::string SerializeSafetensors(
    const std::map<std::string, attn::Tensor>& tensors) {
  return Serialize(tensors);
}

std::string SerializeSafetensors(
    const std::map<std::string, StoredTensor>& tensors) {
  return Serialize(tensors);
}

int64_t SafetensorsSize(const std::map<std::string, StoredTensor>& tensors,
                        const SafetensorsMetadata& metadata) {
  uint64_t data_size = 0;
  const uint64_t head = HeadOf(tensors, metadata, &data_size).size();
  return static_cast<int64_t>(head + data_size);
}

absl::Status WriteSafetensors(
    const std::map<std::string, StoredTensor>& tensors,
    absl::FunctionRef<absl::Status(absl::string_view)> write,
    const SafetensorsMetadata& metadata) {
  return WriteInPieces(tensors, metadata, write);
}

}  // namespace attnserve
