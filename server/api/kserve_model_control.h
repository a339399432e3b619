// The KServe service's model repository extension (Triton's): the
// repository's index, and live loading and unloading of its models.
//
// Thread-safe: the repository serializes loads and unloads
// (server/repository/model_repository.h). Load and Unload block while the
// repository reads or drops a model's files; Index only for its lock.
#ifndef ATTNSERVE_SERVER_API_KSERVE_MODEL_CONTROL_H_
#define ATTNSERVE_SERVER_API_KSERVE_MODEL_CONTROL_H_

#include <string>

#include "absl/status/status.h"
#include "inference/grpc_service.pb.h"
#include "server/repository/model_repository.h"

namespace attnserve {

// Live model control (Triton's --model-control-mode): with `explicit_mode`,
// RepositoryModelLoad and RepositoryModelUnload load, reload and unload the
// repository's models while the server runs (calls in flight on an unloaded
// model finish with it: server/repository/model_repository.h); without it
// they answer FAILED_PRECONDITION. With `needs_permission` (token
// authentication on), only tokens with the model_control permission may
// (server/api/auth.h); others get PERMISSION_DENIED. Built-in models are
// always served: loading one is a no-op, unloading one INVALID_ARGUMENT.
struct ModelControl {
  bool explicit_mode = false;
  bool needs_permission = false;
};

class ModelController {
 public:
  // `repository` may be null (no --model_repository); borrowed, it must
  // outlive the controller.
  ModelController(ModelRepository* repository, const ModelControl& control)
      : repository_(repository), control_(control) {}

  // Every model with its state: the built-in ones READY (UNAVAILABLE, "the
  // server is draining", while not `server_ready`), then the repository's
  // as it reports them (a READY one UNAVAILABLE while draining); only the
  // READY ones when the request asks for ready models only.
  void Index(bool server_ready, const inference::RepositoryIndexRequest& request,
             inference::RepositoryIndexResponse* response) const;

  // `may_control_models`: the call's token grants model_control (or tokens
  // are off). OK, or why not: FAILED_PRECONDITION (model control off, no
  // repository), PERMISSION_DENIED (the call's token), INVALID_ARGUMENT (no
  // name, an unsupported parameter, unloading a built-in model), or the
  // repository's own error (NOT_FOUND, a broken model's INVALID_ARGUMENT).
  absl::Status Load(bool may_control_models,
                    const inference::RepositoryModelLoadRequest& request);
  absl::Status Unload(bool may_control_models,
                      const inference::RepositoryModelUnloadRequest& request);

 private:
  // Why a load or unload of `model_name` may not happen, if it may not.
  absl::Status CheckAllowed(bool may_control_models,
                            const std::string& model_name) const;

  ModelRepository* const repository_;
  const ModelControl control_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_API_KSERVE_MODEL_CONTROL_H_
