// Fuzz target: the safetensors reader (attnserve::ParseSafetensors,
// server/repository/model_repository.cc), which reads every model's
// weights.safetensors at start-up.
//
// Feeds: the bytes of a weights.safetensors file (8-byte little-endian
// header length, JSON header, data), as ModelRepository::Load hands them.
//
// Asserts, beyond "no crash, no leak, no undefined behaviour":
// - a parsed file gives tensors whose every dimension is >= 1, whose element
//   count is at most 2^31-1 and equals the length of their data;
// - what was accepted was well formed, checked against the header read
//   here: every accepted tensor is F32, its shape a list of integers >= 1,
//   its data_offsets two integers 0 <= begin <= end within the data section
//   with end - begin = 4 x its element count, and its data exactly the file's
//   bytes [begin, end) of the data section (a fractional or out-of-range
//   number must be refused, not truncated);
// - a round trip is exact: SerializeSafetensors of the parsed tensors parses
//   back to the same names, shapes and bit patterns, and serializing that
//   again gives the same bytes (SerializeSafetensors' output is a fixed
//   point of parse-then-serialize).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>

#include "fuzz/common/check.h"
#include "fuzz/common/shapes.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/json_util.h"
#include "server/repository/model_repository.h"

namespace {

using Tensors = std::map<std::string, attn::Tensor>;

void CheckTensors(const char* what, const Tensors& tensors) {
  for (const auto& [name, tensor] : tensors) {
    const auto count = attn_fuzz::ElementCount(tensor.shape);
    FUZZ_CHECK(count.has_value(), "%s: tensor '%s' has shape %s", what,
               name.c_str(), attn_fuzz::DimsToString(tensor.shape).c_str());
    FUZZ_CHECK(static_cast<int64_t>(tensor.data.size()) == *count,
               "%s: tensor '%s' of shape %s holds %zu values", what,
               name.c_str(), attn_fuzz::DimsToString(tensor.shape).c_str(),
               tensor.data.size());
  }
}

bool SameTensors(const Tensors& a, const Tensors& b) {
  if (a.size() != b.size()) return false;
  for (auto i = a.begin(), j = b.begin(); i != a.end(); ++i, ++j) {
    if (i->first != j->first || i->second.shape != j->second.shape ||
        i->second.data.size() != j->second.data.size() ||
        std::memcmp(i->second.data.data(), j->second.data.data(),
                    4 * i->second.data.size()) != 0) {
      return false;
    }
  }
  return true;
}

// A JSON number that is an integer in [lo, hi], as an int64.
bool Integer(const google::protobuf::Value& value, double lo, double hi,
             int64_t* out) {
  if (value.kind_case() != google::protobuf::Value::kNumberValue) return false;
  const double number = value.number_value();
  if (!(number >= lo && number <= hi) || std::floor(number) != number) {
    return false;
  }
  *out = static_cast<int64_t>(number);
  return true;
}

// Checks the accepted tensors against the file's header, read here again.
void CheckAgainstHeader(const std::string& bytes, const Tensors& tensors) {
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  google::protobuf::Struct header;
  FUZZ_CHECK(google::protobuf::util::JsonStringToMessage(
                 bytes.substr(8, header_size), &header)
                 .ok(),
             "accepted a header that is not JSON");
  const std::string section = bytes.substr(8 + header_size);
  for (const auto& [name, tensor] : tensors) {
    auto entry = header.fields().find(name);
    FUZZ_CHECK(entry != header.fields().end(), "tensor '%s' not in the header",
               name.c_str());
    const auto& fields = entry->second.struct_value().fields();
    FUZZ_CHECK(fields.count("dtype") &&
                   fields.at("dtype").string_value() == "F32",
               "tensor '%s': dtype other than F32 accepted", name.c_str());
    const auto& shape = fields.at("shape").list_value();
    FUZZ_CHECK(shape.values_size() == static_cast<int>(tensor.shape.size()),
               "tensor '%s': rank %d in the file, %zu parsed", name.c_str(),
               shape.values_size(), tensor.shape.size());
    for (int i = 0; i < shape.values_size(); ++i) {
      int64_t dim = 0;
      FUZZ_CHECK(Integer(shape.values(i), 1, 9.2e18, &dim) &&
                     dim == tensor.shape[i],
                 "tensor '%s': dimension %d is %.17g in the file, accepted as "
                 "%lld",
                 name.c_str(), i, shape.values(i).number_value(),
                 static_cast<long long>(tensor.shape[i]));
    }
    const auto& offsets = fields.at("data_offsets").list_value();
    int64_t begin = 0, end = 0;
    FUZZ_CHECK(offsets.values_size() == 2 &&
                   Integer(offsets.values(0), 0, 9.2e18, &begin) &&
                   Integer(offsets.values(1), 0, 9.2e18, &end),
               "tensor '%s': data_offsets [%.17g, %.17g] accepted",
               name.c_str(), offsets.values(0).number_value(),
               offsets.values(1).number_value());
    const int64_t length = 4 * static_cast<int64_t>(tensor.data.size());
    FUZZ_CHECK(begin <= end && end <= static_cast<int64_t>(section.size()) &&
                   end - begin == length,
               "tensor '%s': data_offsets [%lld, %lld) for %lld bytes of a "
               "%zu-byte data section accepted",
               name.c_str(), static_cast<long long>(begin),
               static_cast<long long>(end), static_cast<long long>(length),
               section.size());
    FUZZ_CHECK(std::memcmp(section.data() + begin, tensor.data.data(),
                           length) == 0,
               "tensor '%s': its values are not the file's bytes [%lld, %lld)",
               name.c_str(), static_cast<long long>(begin),
               static_cast<long long>(end));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<Tensors> parsed = attnserve::ParseSafetensors(bytes);
  if (!parsed.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(parsed.status()), "status %s",
               parsed.status().ToString().c_str());
    return 0;
  }
  CheckTensors("parsed", *parsed);

  CheckAgainstHeader(bytes, *parsed);

  const std::string serialized = attnserve::SerializeSafetensors(*parsed);
  absl::StatusOr<Tensors> again = attnserve::ParseSafetensors(serialized);
  FUZZ_CHECK(again.ok(), "our own serialization does not parse: %s",
             again.status().ToString().c_str());
  CheckTensors("round trip", *again);
  FUZZ_CHECK(SameTensors(*parsed, *again),
             "the round trip changed the tensors");
  FUZZ_CHECK(attnserve::SerializeSafetensors(*again) == serialized,
             "serializing the round trip gave other bytes");
  return 0;
}
