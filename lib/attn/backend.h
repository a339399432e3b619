// The interface every backend (the plain reference, oneDNN on the CPU, CUDA)
// implements: one entry point per operation, each taking the validated params
// struct of attn/params.h.
//
// A backend may hold several implementations of an operation (the CPU
// backend an ordered list of kernels, the CUDA backend a fused and an
// unfused attention); each call reports the one that ran, by name, so that
// results and metrics can tell them apart.
//
// Contract for implementations:
// - Thread safety: every method may be called concurrently from many threads.
// - A method that runs the call returns the name of the implementation that
//   ran it: one of implementation_names(), in storage that lives as long as
//   the backend (in practice a string literal).
// - A method that cannot take the params (precision, shape, CPU features, a
//   missing device) returns UNIMPLEMENTED before writing any output; the
//   Engine then offers the call to the next backend in its list, which always
//   ends in the reference backend. Any other non-OK status is final and is
//   returned to the caller (INTERNAL for a library failure, RESOURCE_EXHAUSTED
//   when scratch memory cannot be had).
// - Outputs are pre-allocated by the caller; a backend writes every element of
//   each non-null output, including zeros for masked positions.
// - Methods block until the result is in the output buffers.
#ifndef ATTN_BACKEND_H_
#define ATTN_BACKEND_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attn/held_memory.h"
#include "attn/params.h"

namespace attn {

class Backend {
 public:
  virtual ~Backend() = default;

  // A short stable identifier, reported with every result beside the
  // implementation that ran ("reference", "onednn-cpu", "cuda").
  virtual std::string name() const = 0;
  // What a start-up log line says of it; the name unless a backend has more
  // to tell (the CUDA backend names its GPU).
  virtual std::string description() const { return name(); }
  // Every name a method of this backend may return, each once, so that a
  // server can bind its metric labels at start-up. A backend with one
  // implementation of everything reports its own name.
  virtual std::vector<std::string> implementation_names() const {
    return {name()};
  }

  // Whether a call of `params` has its keys shared out among threads, so
  // that one call over many keys uses every core the backend has.
  virtual bool SpreadsKeysAcrossThreads(const AttentionParams& params) const {
    (void)params;
    return false;
  }

  // What a backend that keeps held memories on its device holds (the CUDA
  // backend's); none for the others.
  virtual std::optional<HeldMemoryStats> held_memory_stats() const {
    return std::nullopt;
  }

  virtual absl::StatusOr<const char*> MaskedSoftmax(
      const MaskedSoftmaxParams& params) = 0;
  virtual absl::StatusOr<const char*> BatchMatmul(
      const BatchMatmulParams& params) = 0;
  virtual absl::StatusOr<const char*> ScaledDotProductAttention(
      const AttentionParams& params) = 0;
  virtual absl::StatusOr<const char*> AdditiveAttention(
      const AdditiveAttentionParams& params) = 0;
  virtual absl::StatusOr<const char*> NadarayaWatson(
      const NadarayaWatsonParams& params) = 0;
};

}  // namespace attn

#endif  // ATTN_BACKEND_H_
