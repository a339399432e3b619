#include "client/tensors.h"

#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/descriptor.h"

namespace attnctl {
namespace {

using attention::v1::Tensor;
using attention::v1::TensorEncoding;

std::string ToLittleEndianBytes(absl::Span<const float> elements) {
  std::string bytes(elements.size() * 4, '\0');
  for (size_t i = 0; i < elements.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &elements[i], 4);
    for (int byte = 0; byte < 4; ++byte) {
      bytes[4 * i + byte] = static_cast<char>((bits >> (8 * byte)) & 0xFF);
    }
  }
  return bytes;
}

std::vector<float> FromLittleEndianBytes(const std::string& bytes) {
  std::vector<float> elements(bytes.size() / 4);
  for (size_t i = 0; i < elements.size(); ++i) {
    uint32_t bits = 0;
    for (int byte = 0; byte < 4; ++byte) {
      bits |=
          static_cast<uint32_t>(static_cast<unsigned char>(bytes[4 * i + byte]))
          << (8 * byte);
    }
    std::memcpy(&elements[i], &bits, 4);
  }
  return elements;
}

}  // namespace

absl::StatusOr<std::vector<float>> ReadElements(const Tensor& tensor) {
  if (tensor.values_size() > 0 || tensor.raw().empty()) {
    return std::vector<float>(tensor.values().begin(), tensor.values().end());
  }
  if (tensor.raw().size() % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "raw tensor data has %d bytes, not a whole number of float32s",
        tensor.raw().size()));
  }
  return FromLittleEndianBytes(tensor.raw());
}

void WriteElements(absl::Span<const float> elements, TensorEncoding encoding,
                   Tensor* tensor) {
  if (encoding == attention::v1::TENSOR_ENCODING_RAW) {
    tensor->clear_values();
    tensor->set_raw(ToLittleEndianBytes(elements));
  } else {
    tensor->clear_raw();
    tensor->mutable_values()->Assign(elements.begin(), elements.end());
  }
}

absl::Status Reencode(TensorEncoding encoding, Tensor* tensor) {
  absl::StatusOr<std::vector<float>> elements = ReadElements(*tensor);
  if (!elements.ok()) return elements.status();
  WriteElements(*elements, encoding, tensor);
  return absl::OkStatus();
}

namespace {

void VisitTensorsUnder(const std::string& prefix,
                       google::protobuf::Message* message,
                       const TensorVisitor& visit) {
  const google::protobuf::Reflection* reflection = message->GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(*message, &fields);
  for (const google::protobuf::FieldDescriptor* field : fields) {
    if (field->cpp_type() !=
        google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      continue;
    }
    const bool is_tensor = field->message_type() == Tensor::descriptor();
    auto handle = [&](const std::string& path,
                      google::protobuf::Message* child) {
      if (!is_tensor) {
        VisitTensorsUnder(path + ".", child, visit);
      } else if (Tensor* tensor =
                     google::protobuf::DynamicCastToGenerated<Tensor>(child)) {
        visit(path, tensor);
      }
    };
    const std::string path = prefix + field->name();
    if (field->is_repeated()) {
      for (int i = 0; i < reflection->FieldSize(*message, field); ++i) {
        handle(absl::StrFormat("%s[%d]", path, i),
               reflection->MutableRepeatedMessage(message, field, i));
      }
    } else {
      handle(path, reflection->MutableMessage(message, field));
    }
  }
}

}  // namespace

void ForEachTensor(google::protobuf::Message* message,
                   const TensorVisitor& visit) {
  VisitTensorsUnder("", message, visit);
}

}  // namespace attnctl
