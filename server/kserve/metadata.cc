#include "server/kserve/metadata.h"

#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace attnserve {

void DescribeServer(inference::ServerMetadataResponse* response) {
  response->set_name("attnserve");
  response->set_version("0.1.0");
  response->add_extensions("model_configuration");
  response->add_extensions("statistics");
  // Triton's names: the repository index, load and unload; priorities and
  // timeouts. ModelStreamInfer has no extension name in Triton; ours is
  // the RPC's.
  response->add_extensions("model_repository");
  response->add_extensions("schedule_policy");
  response->add_extensions("model_stream_infer");
}

void DescribeModel(const ModelSignature& model,
                   inference::ModelMetadataResponse* response) {
  response->set_name(model.name);
  response->add_versions(kServedModelVersion);
  response->set_platform("attnserve");
  for (const TensorSpec& spec : model.inputs) {
    auto* input = response->add_inputs();
    input->set_name(spec.name);
    input->set_datatype(spec.datatype);
    input->mutable_shape()->Assign(spec.shape.begin(), spec.shape.end());
  }
  for (const TensorSpec& spec : model.outputs) {
    auto* output = response->add_outputs();
    output->set_name(spec.name);
    output->set_datatype(spec.datatype);
    output->mutable_shape()->Assign(spec.shape.begin(), spec.shape.end());
  }
}

void ConfigureModel(const ServedModel& model, int max_batch_size,
                    const BatchingOptions* batching,
                    inference::ModelConfig* config) {
  const bool built_in = model.stored == nullptr;
  if (!built_in) *config = model.stored->config;
  config->set_name(model.signature.name);
  config->set_platform("attnserve");
  if (built_in) config->set_backend("attnserve");
  config->clear_input();
  config->clear_output();
  // A batch dimension is left out of the config's dims.
  const bool batched = model.kind->config_batch_dimension;
  config->set_max_batch_size(batched ? max_batch_size : 0);
  auto dims = [batched](const TensorSpec& spec) {
    return std::vector<int64_t>(spec.shape.begin() + (batched ? 1 : 0),
                                spec.shape.end());
  };
  for (const TensorSpec& spec : model.signature.inputs) {
    auto* input = config->add_input();
    input->set_name(spec.name);
    input->set_data_type(spec.datatype == "FP32" ? inference::TYPE_FP32
                                                 : inference::TYPE_INT32);
    const std::vector<int64_t> d = dims(spec);
    input->mutable_dims()->Assign(d.begin(), d.end());
    input->set_optional(spec.optional);
    input->set_allow_ragged_batch(batched);
  }
  for (const TensorSpec& spec : model.signature.outputs) {
    auto* output = config->add_output();
    output->set_name(spec.name);
    output->set_data_type(inference::TYPE_FP32);
    const std::vector<int64_t> d = dims(spec);
    output->mutable_dims()->Assign(d.begin(), d.end());
  }
  if (batched && batching != nullptr) {
    inference::ModelDynamicBatching* dynamic = config->mutable_dynamic_batching();
    for (int size : batching->preferred_batch_sizes) {
      dynamic->add_preferred_batch_size(size);
    }
    dynamic->set_max_queue_delay_microseconds(static_cast<uint64_t>(
        absl::ToInt64Microseconds(batching->max_queue_delay)));
    dynamic->mutable_default_queue_policy()->set_max_queue_size(
        static_cast<uint32_t>(batching->max_queue_size));
  }
}

}  // namespace attnserve
