// The safetensors format of a model's weights (weights.safetensors): an
// 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte offsets, then the data. Only F32 tensors.
// Pure functions; thread-safe.
#ifndef ATTNSERVE_SERVER_REPOSITORY_SAFETENSORS_H_
#define ATTNSERVE_SERVER_REPOSITORY_SAFETENSORS_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "attn/tensor.h"

namespace attnserve {

// Parses a file's bytes; INVALID_ARGUMENT naming the problem (a header
// that is short, runs past the file or is not JSON, a tensor without dtype,
// shape or offsets, a dtype other than F32, offsets that do not hold the
// shape's values inside the data).
absl::StatusOr<std::map<std::string, attn::Tensor>> ParseSafetensors(
    const std::string& bytes);
// The bytes of `tensors` in the same format (ParseSafetensors reads them
// back exactly).
std::string SerializeSafetensors(
    const std::map<std::string, attn::Tensor>& tensors);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REPOSITORY_SAFETENSORS_H_
