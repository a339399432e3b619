// The safetensors format of a model's weights (weights.safetensors): an
// 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte offsets, then the data. F32 and BF16 tensors (the
// latter for memories stored rounded).
// Pure functions; thread-safe.
#ifndef ATTNSERVE_SERVER_REPOSITORY_SAFETENSORS_H_
#define ATTNSERVE_SERVER_REPOSITORY_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attn/tensor.h"
#include "server/repository/file_system.h"
#include "server/repository/stored_tensor.h"

namespace attnserve {

// Where one tensor's values lie in a file's bytes.
struct SafetensorsEntry {
  attn::Shape shape;
  bool bfloat16 = false;  // BF16 values, else F32
  size_t offset = 0;      // of the first value, from the file's start
};

// Reads a file's header, checking it against the file: INVALID_ARGUMENT
// naming the problem (a header that is short, runs past the file or is not
// JSON, a tensor without dtype, shape or offsets, a dtype other than F32 or
// BF16, offsets that do not hold the shape's values inside the data).
absl::StatusOr<std::map<std::string, SafetensorsEntry>> ParseSafetensorsIndex(
    absl::string_view bytes);
// The header's "__metadata__" (the format's string-to-string map); empty
// without one. The header's errors, and INVALID_ARGUMENT for a
// "__metadata__" that is not an object of strings.
using SafetensorsMetadata = std::map<std::string, std::string>;
absl::StatusOr<SafetensorsMetadata> ParseSafetensorsMetadata(
    absl::string_view bytes);
// The file's float32 tensors, copied out of its bytes; the same errors, and
// INVALID_ARGUMENT for a BF16 tensor.
absl::StatusOr<std::map<std::string, attn::Tensor>> ParseSafetensors(
    absl::string_view bytes);
// The file's tensors as views into `file`, which they keep alive (a tensor
// whose values are not aligned for their type is copied instead); the same
// errors.
absl::StatusOr<std::map<std::string, StoredTensor>> ParseSafetensorsShared(
    std::shared_ptr<const FileBytes> file);

// The bytes of `tensors` in the same format (ParseSafetensors reads them
// back exactly), every tensor's values aligned for their type: F32 tensors
// first, then BF16 ones, each group in name order.
std::string SerializeSafetensors(
    const std::map<std::string, attn::Tensor>& tensors);
std::string SerializeSafetensors(
    const std::map<std::string, StoredTensor>& tensors);

// The most bytes WriteSafetensors hands over at once.
inline constexpr size_t kSafetensorsPiece = size_t{8} << 20;

// The size of what WriteSafetensors hands over, without making it.
int64_t SafetensorsSize(const std::map<std::string, StoredTensor>& tensors,
                        const SafetensorsMetadata& metadata = {});

// Hands the same bytes as SerializeSafetensors to `write` in order (with
// `metadata` as the header's "__metadata__" when it is not empty), in
// pieces of at most kSafetensorsPiece (the header first, then each
// tensor's values read where they lie), so that a file of any size is
// written without a copy of it in memory. Stops at `write`'s first error
// and returns it.
absl::Status WriteSafetensors(
    const std::map<std::string, StoredTensor>& tensors,
    absl::FunctionRef<absl::Status(absl::string_view)> write,
    const SafetensorsMetadata& metadata = {});

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REPOSITORY_SAFETENSORS_H_
