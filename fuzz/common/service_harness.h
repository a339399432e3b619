// Both gRPC services (attention.v1 and KServe's inference.v2) in process,
// without a server or a socket: handlers are called directly with a
// CallbackServerContext, and the reactor a handler returns (the context's
// DefaultReactor() or one of its own) is bound to a stand-in for gRPC's call
// object (grpc::ServerCallbackUnary) that records the status Finish gives,
// then gets OnDone(), as on a real server. So a call's decoding, its
// validation and its kernel run exactly as on a real server, and Call()
// returns the status the client would get.
//
// The engine runs the fuzzing CheckingBackend, then the reference backend
// (fuzz/common/checking_backend.h): no oneDNN, one worker thread, the
// server's default limits but for a 256 KiB response limit
// (kMaxResponseBytes), assembled by the server's own factory
// (server/execution/execution_stack.h). ATTN_FUZZ_BATCHING=1 in the environment runs
// every call through the batcher, exactly as `attnserve --batching` does. The model repository is a private copy of
// deploy/models in a temporary folder (FitBandwidth's save_as writes there;
// see MakeTemporaryFolder).
//
// One harness per process (Get()); not thread-safe: the fuzzer's single
// thread calls it.
#ifndef ATTN_FUZZ_COMMON_SERVICE_HARNESS_H_
#define ATTN_FUZZ_COMMON_SERVICE_HARNESS_H_

#include <functional>
#include <memory>
#include <string>

#include "attn/engine.h"
#include "grpcpp/grpcpp.h"
#include "server/typed/attention_service.h"
#include "server/kserve/inference_service.h"
#include "server/execution/execution_stack.h"
#include "server/models/model_catalogue.h"
#include "server/repository/model_repository.h"

namespace attn_fuzz {

// Calls below this many nominal flops run on the reference kernels; larger
// ones only on the CheckingBackend.
inline constexpr double kReferenceBelowFlops = 2e5;
// The services' response limit (--max_message_bytes) in the fuzz targets:
// 256 KiB instead of the server's 256 MiB, so that inputs of libFuzzer's
// default 4 KiB reach it (a (1, 257, 1) x (1, 1, 257) product already
// does); the CheckingBackend checks no larger result is ever computed.
inline constexpr int64_t kMaxResponseBytes = int64_t{256} << 10;

class ServiceHarness {
 public:
  // Created on first use; aborts if the services cannot be built.
  static ServiceHarness& Get();

  attnserve::AttentionService& typed() { return *typed_; }
  attnserve::InferenceService& kserve() { return *kserve_; }
  attnserve::ModelRepository& repository() { return *repository_; }
  const attnserve::ModelCatalogue& catalogue() const { return *catalogue_; }
  const std::string& repository_dir() const { return repository_dir_; }

  // Calls one handler: `invoke` calls it with a fresh context (and returns
  // what it returned); blocks until the call finishes, on this thread or on
  // the worker, calls the reactor's OnDone() and returns the call's status.
  // The response is complete then.
  grpc::Status Call(
      const std::function<grpc::ServerUnaryReactor*(grpc::CallbackServerContext*)>&
          invoke);

 private:
  ServiceHarness() = default;

  std::string repository_dir_;
  std::unique_ptr<attnserve::ExecutionStack> core_;
  std::unique_ptr<attnserve::ModelRepository> repository_;
  std::unique_ptr<attnserve::ModelCatalogue> catalogue_;
  std::unique_ptr<attnserve::AttentionService> typed_;
  std::unique_ptr<attnserve::InferenceService> kserve_;
};

// The status codes a decoder may answer malformed input with; anything else
// (INTERNAL, UNKNOWN, ...) on fuzzed input is a bug.
bool IsExpectedErrorCode(grpc::StatusCode code);

// A private temporary folder, removed with everything in it at a normal
// exit. Under $ATTN_FUZZ_TMPDIR when set, else /dev/shm when it exists, else
// /tmp. A crash leaves it: fuzz/run_fuzzers.sh sets ATTN_FUZZ_TMPDIR to a
// folder of its own and removes that when it exits; a crash reproduced by
// hand leaves a /dev/shm/attn-fuzz-* folder. Aborts on failure.
std::string MakeTemporaryFolder(const char* prefix);
// Writes `bytes` to `path`; aborts on failure.
void WriteFileOrDie(const std::string& path, const std::string& bytes);
// Removes `path` and everything under it; ignores what is not there.
void RemoveTree(const std::string& path);

}  // namespace attn_fuzz

#endif  // ATTN_FUZZ_COMMON_SERVICE_HARNESS_H_
