// What the KServe service says about itself and its models: ServerMetadata,
// ModelMetadata and Triton's ModelConfig, each filled from the catalogue's
// description of a model (server/models/model_catalogue.h).
//
// Pure functions of their arguments; thread-compatible; none blocks.
#ifndef ATTNSERVE_SERVER_KSERVE_METADATA_H_
#define ATTNSERVE_SERVER_KSERVE_METADATA_H_

#include "inference/grpc_service.pb.h"
#include "server/models/model_catalogue.h"
#include "server/execution/batcher.h"

namespace attnserve {

// The server's name, version and the protocol extensions it implements.
void DescribeServer(inference::ServerMetadataResponse* response);

// A model's name, version, platform and tensors.
void DescribeModel(const ModelSignature& model,
                   inference::ModelMetadataResponse* response);

// A model's configuration: a repository model's config.pbtxt, a built-in
// one's backend "attnserve", with the tensors as served. A kind with a
// batch dimension in its config (dot_product_attention: see
// ModelKind::config_batch_dimension) reports `max_batch_size`, leaves the
// batch dimension out of its dims and allows ragged batches; with
// `batching` (null when the server does not batch), also the batcher's
// options as dynamic_batching. Every other model reports max_batch_size 0.
void ConfigureModel(const ServedModel& model, int max_batch_size,
                    const BatchingOptions* batching,
                    inference::ModelConfig* config);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_KSERVE_METADATA_H_
