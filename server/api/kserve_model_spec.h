// The tensors of a model the KServe v2 service serves (server/api/
// inference_service.h), as ModelMetadata reports them and as a ModelInfer
// call's inputs are checked against: names, datatypes, shapes, and which
// outputs come back when a call asks for none.
//
// Plain values; thread-compatible.
#ifndef ATTNSERVE_SERVER_API_KSERVE_MODEL_SPEC_H_
#define ATTNSERVE_SERVER_API_KSERVE_MODEL_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "server/core/rpc.h"

namespace attnserve {

// Every served model has this one version; a call naming another is
// NOT_FOUND.
inline constexpr char kServedModelVersion[] = "1";

struct KServeTensorSpec {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;  // -1: variable; batch dim first if batched
  bool optional = false;
};

struct KServeModelSpec {
  std::string name;
  Rpc rpc;  // whose metrics and limits it shares
  std::vector<KServeTensorSpec> inputs;
  std::vector<KServeTensorSpec> outputs;
  std::vector<std::string> default_outputs;  // when none are requested
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_API_KSERVE_MODEL_SPEC_H_
