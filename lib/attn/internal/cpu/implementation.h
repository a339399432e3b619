// The CPU backend's unit of choice: one implementation of one operation.
//
// The backend (attn/onednn_backend.h) holds, per operation, an ordered list
// of them (attn/internal/cpu/implementation_lists.h). Each says whether it
// takes a call and runs it; the first in its list that takes a call runs
// it, and its name is reported with the result (OpResult::implementation)
// and counted by the service (attnserve_kernel_runs_total{implementation}).
// This is oneDNN's own shape (an ordered list of implementations per
// primitive, each answering "can I take it?", the one that ran reported by
// name), one level inside our Backend, whose Engine list has it too.
//
// Contract for an implementation:
// - `name` is short and stable: it is a metric label. It says "onednn" only
//   where oneDNN does the work.
// - `takes(call)` decides from the call alone: its params, the threads it
//   may use, the CPU's features and, for kernels compiled per instruction
//   set, the copy it is compiled into. Every threshold and feature check that
//   makes this implementation the right one is in it and nowhere else. It is
//   complete on its own (it never counts on an earlier implementation having
//   declined: the order says which is preferred, not which is correct),
//   cheap, and free of side effects.
// - `run(call)` runs a call that takes(call) accepted. It blocks, writes
//   every element of every non-null output, and may run concurrently with
//   other calls (its scratch is per call or per thread). Status codes:
//   INTERNAL when oneDNN fails. It may throw std::bad_alloc for scratch
//   memory; RunFirstThatTakes turns that into RESOURCE_EXHAUSTED, so no
//   exception leaves the backend.
#ifndef ATTN_INTERNAL_CPU_IMPLEMENTATION_H_
#define ATTN_INTERNAL_CPU_IMPLEMENTATION_H_

#include <algorithm>
#include <new>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace attn::internal {

class OneDnnPrimitives;

// What the CPU backend knows of the machine, found once when it is created
// (attn/internal/block_matmul.h).
struct CpuFeatures {
  // oneDNN multiplies bfloat16 in hardware: AVX512-BF16 or AMX, after
  // ONEDNN_MAX_CPU_ISA's cap.
  bool bfloat16_products = false;
  // oneDNN runs those products on AMX tiles.
  bool amx_products = false;
  // Our own kernels may run AMX tile instructions: the backend's instruction
  // set is CpuIsa::kAmx (attn/cpu_isa.h; capping it at avx512 turns this
  // off, whatever oneDNN does).
  bool amx_tiles = false;
};

// One call as its implementations see it.
template <typename Params>
struct CpuCall {
  const Params& params;  // validated (attn/validate.h)
  // OpenMP threads the call may use; 1 runs it on the calling thread alone.
  int threads;
  const CpuFeatures& cpu;
  // The backend's cache of oneDNN primitives (thread-safe).
  OneDnnPrimitives& primitives;
};

template <typename Params>
struct CpuImplementation {
  const char* name;
  bool (*takes)(const CpuCall<Params>& call);
  absl::Status (*run)(const CpuCall<Params>& call);
};

// An ordered list: the first implementation that takes a call runs it.
template <typename Params>
using CpuImplementationList =
    absl::Span<const CpuImplementation<Params>* const>;

// Runs `call` on the first implementation in `list` that takes it, leaving
// out those named in `skipped` (a test's switch: EngineOptions::
// skipped_cpu_implementations), and returns that implementation's name.
// UNIMPLEMENTED when none takes it (the backend then declines the call);
// otherwise run()'s status, with RESOURCE_EXHAUSTED for a std::bad_alloc it
// threw.
template <typename Params>
absl::StatusOr<const char*> RunFirstThatTakes(
    CpuImplementationList<Params> list, const CpuCall<Params>& call,
    absl::Span<const std::string> skipped = {}) {
  for (const CpuImplementation<Params>* implementation : list) {
    if (std::find(skipped.begin(), skipped.end(), implementation->name) !=
        skipped.end()) {
      continue;
    }
    if (!implementation->takes(call)) continue;
    absl::Status status;
    try {
      status = implementation->run(call);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(absl::StrCat(
          implementation->name, ": no memory for the call's scratch"));
    }
    if (!status.ok()) return status;
    return implementation->name;
  }
  return absl::UnimplementedError("no CPU implementation takes the call");
}

}  // namespace attn::internal

#endif  // ATTN_INTERNAL_CPU_IMPLEMENTATION_H_
