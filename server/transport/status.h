// The one place an absl::Status becomes a grpc::Status. The canonical codes
// are numbered alike in both, so the code carries over unchanged.
#ifndef ATTNSERVE_SERVER_TRANSPORT_STATUS_H_
#define ATTNSERVE_SERVER_TRANSPORT_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace attnserve {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_TRANSPORT_STATUS_H_
