#include "client/load_pool.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "attention/v1/attention.pb.h"
#include "client/tensors.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.pb.h"

namespace attnctl {
namespace {

// Where --lk_range and --valid_lens_range act in an RPC's request.
struct KeyLengthSite {
  std::vector<absl::string_view> tensors;  // whose dimension `axis` is Lk
  int axis = -2;                           // from the end
  absl::string_view batch_tensor;          // whose dimension 0 is B
};

std::optional<KeyLengthSite> KeyLengthSiteOf(LoadRpc rpc) {
  switch (rpc) {
    case LoadRpc::kScaledDotProductAttention:
    case LoadRpc::kAdditiveAttention:
      return KeyLengthSite{{"keys", "values"}, -2, "queries"};
    case LoadRpc::kMaskedSoftmax:
      return KeyLengthSite{{"x"}, -1, "x"};
    default:
      return std::nullopt;
  }
}

// `base`, with every shape of `overrides` replacing or joining it by name.
std::vector<NamedShape> MergeShapes(const std::vector<NamedShape>& base,
                                    const std::vector<NamedShape>& overrides) {
  std::vector<NamedShape> merged = base;
  for (const NamedShape& shape : overrides) {
    auto same_name = [&](const NamedShape& other) {
      return other.name == shape.name;
    };
    auto it = std::find_if(merged.begin(), merged.end(), same_name);
    if (it == merged.end()) {
      merged.push_back(shape);
    } else {
      it->dims = shape.dims;
    }
  }
  return merged;
}

// Splits `total` items into shares proportional to `weights` (all > 0), by
// largest remainder; ties go to the earlier weight.
std::vector<int> Apportion(const std::vector<double>& weights, int total) {
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<int> counts(weights.size());
  std::vector<double> remainders(weights.size());
  int given = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const double exact = weights[i] / sum * total;
    counts[i] = static_cast<int>(std::floor(exact));
    remainders[i] = exact - counts[i];
    given += counts[i];
  }
  std::vector<size_t> order(weights.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return remainders[a] > remainders[b];
  });
  for (size_t i = 0; given < total; ++i, ++given) ++counts[order[i]];
  return counts;
}

// The dims of every tensor of `request`, by field path.
std::map<std::string, Dims> TensorDims(google::protobuf::Message* request) {
  std::map<std::string, Dims> dims;
  ForEachTensor(request,
                [&](const std::string& path, attention::v1::Tensor* tensor) {
                  dims[path] = Dims(tensor->shape().begin(),
                                    tensor->shape().end());
                });
  return dims;
}

absl::Status CheckPoolBytes(int64_t bytes, int entries) {
  if (bytes <= kMaxPoolBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "the request pool would hold more than %d MiB (%d requests so far, %d "
      "MiB); lower --pool_size or the shapes",
      kMaxPoolBytes >> 20, entries, bytes >> 20));
}

template <typename Request>
absl::StatusOr<Request> ParseInput(const std::string& json) {
  Request request;
  if (json.empty()) return request;
  const auto parsed = google::protobuf::util::JsonStringToMessage(json, &request);
  if (!parsed.ok()) {
    const std::string message(parsed.message());
    return absl::InvalidArgumentError(absl::StrFormat(
        "--input: not a JSON %s: %s", Request::descriptor()->full_name(),
        message.substr(0, message.find('\n'))));
  }
  return request;
}

// The pool's entries for an AttentionService RPC taking `Request`.
template <typename Request>
absl::Status BuildEntries(const PoolOptions& options, RequestPool* pool) {
  absl::StatusOr<Request> base = ParseInput<Request>(options.input_json);
  if (!base.ok()) return base.status();

  std::vector<MixVariant> variants = options.mix;
  if (variants.empty()) variants.push_back(MixVariant{});
  std::vector<double> weights;
  for (const MixVariant& variant : variants) weights.push_back(variant.weight);
  pool->variant_counts = Apportion(weights, options.pool_size);

  std::mt19937 rng(options.request.seed);
  std::vector<int> variant_of_entry;
  for (size_t v = 0; v < variants.size(); ++v) {
    variant_of_entry.insert(variant_of_entry.end(), pool->variant_counts[v],
                            static_cast<int>(v));
  }
  std::shuffle(variant_of_entry.begin(), variant_of_entry.end(), rng);

  const std::optional<KeyLengthSite> site = KeyLengthSiteOf(options.rpc);
  const bool per_entry_lengths =
      options.lk_range.has_value() || options.valid_lens_range.has_value();

  // Per variant: its shapes, and (for the ranges) the dims it generates.
  std::vector<std::vector<NamedShape>> variant_shapes;
  std::vector<std::map<std::string, Dims>> variant_dims;
  for (size_t v = 0; v < variants.size(); ++v) {
    variant_shapes.push_back(
        MergeShapes(options.request.shapes, variants[v].shapes));
    if (!per_entry_lengths) continue;
    RequestOptions probe_options = options.request;
    probe_options.shapes = variant_shapes.back();
    probe_options.encoding.reset();
    Request probe = *base;
    if (absl::Status status = ApplyOptions(probe_options, &probe);
        !status.ok()) {
      return status;
    }
    variant_dims.push_back(TensorDims(&probe));
  }

  for (size_t i = 0; i < variant_of_entry.size(); ++i) {
    const int v = variant_of_entry[i];
    RequestOptions entry_options = options.request;
    entry_options.seed = options.request.seed + static_cast<uint32_t>(i);
    entry_options.shapes = variant_shapes[v];
    if (per_entry_lengths) {
      const std::map<std::string, Dims>& dims = variant_dims[v];
      // K: drawn, or the variant's own.
      int64_t key_length = -1;
      std::vector<NamedShape> key_shapes;
      for (absl::string_view name : site->tensors) {
        auto it = dims.find(std::string(name));
        const int rank = it == dims.end() ? 0 : static_cast<int>(it->second.size());
        if (rank < -site->axis) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "--%s: tensor %s is %s; it needs at least %d dimensions",
              options.lk_range ? "lk_range" : "valid_lens_range", name,
              rank == 0 ? "absent or a scalar" : absl::StrCat(rank, "-D"),
              -site->axis));
        }
        Dims entry_dims = it->second;
        if (key_length < 0) key_length = entry_dims[rank + site->axis];
        key_shapes.push_back({std::string(name), entry_dims});
      }
      if (options.lk_range) {
        key_length = std::uniform_int_distribution<int64_t>(
            options.lk_range->lo, options.lk_range->hi)(rng);
        for (NamedShape& shape : key_shapes) {
          shape.dims[shape.dims.size() + site->axis] = key_length;
        }
        entry_options.shapes = MergeShapes(entry_options.shapes, key_shapes);
      }
      if (options.valid_lens_range) {
        auto batch = dims.find(std::string(site->batch_tensor));
        if (batch == dims.end() || batch->second.empty()) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "--valid_lens_range: tensor %s is absent or a scalar",
              site->batch_tensor));
        }
        const int64_t hi = std::min(options.valid_lens_range->hi, key_length);
        const int64_t lo = std::min(options.valid_lens_range->lo, hi);
        std::uniform_int_distribution<int32_t> length(static_cast<int32_t>(lo),
                                                      static_cast<int32_t>(hi));
        attention::v1::Lengths lengths;
        lengths.add_shape(batch->second[0]);
        for (int64_t b = 0; b < batch->second[0]; ++b) {
          lengths.add_values(length(rng));
        }
        entry_options.valid_lens = std::move(lengths);
      }
    }
    Request request = *base;
    if (absl::Status status = ApplyOptions(entry_options, &request);
        !status.ok()) {
      return status;
    }
    pool->requests.push_back(request.SerializeAsString());
    pool->bytes += static_cast<int64_t>(pool->requests.back().size());
    // The first entry predicts the whole pool: fail before building it all.
    const int64_t expected =
        i == 0 ? pool->bytes * options.pool_size : pool->bytes;
    if (absl::Status status = CheckPoolBytes(expected, static_cast<int>(i) + 1); !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<IntRange> ParseRange(absl::string_view text, int64_t min_lo) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  IntRange range;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &range.lo) ||
      !absl::SimpleAtoi(parts[1], &range.hi)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "expected LO:HI like 16:128, got '%s'", text));
  }
  if (range.lo < min_lo || range.hi < range.lo || range.hi > (1 << 30)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s': needs %d <= LO <= HI <= 2^30", text, min_lo));
  }
  return range;
}

absl::StatusOr<std::vector<MixVariant>> ParseMix(absl::string_view text) {
  std::vector<MixVariant> variants;
  int position = 0;
  for (absl::string_view item : absl::StrSplit(text, ';')) {
    ++position;
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) continue;
    MixVariant variant;
    const size_t colon = item.find(':');
    if (colon != absl::string_view::npos) {
      const absl::string_view weight = item.substr(0, colon);
      if (!absl::SimpleAtod(weight, &variant.weight) ||
          !std::isfinite(variant.weight) || variant.weight <= 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "variant %d: weight '%s' is not a positive number", position,
            weight));
      }
      item = item.substr(colon + 1);
    }
    std::vector<std::string> items;
    for (absl::string_view shape : absl::StrSplit(item, ',')) {
      items.emplace_back(absl::StripAsciiWhitespace(shape));
    }
    absl::StatusOr<std::vector<NamedShape>> shapes = ParseShapes(items);
    if (!shapes.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "variant %d: %s", position, shapes.status().message()));
    }
    if (shapes->empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("variant %d has no NAME=DIMS", position));
    }
    variant.shapes = *std::move(shapes);
    variants.push_back(std::move(variant));
  }
  if (variants.empty()) {
    return absl::InvalidArgumentError(
        "no variants; expected [W:]NAME=DIMS,...;[W:]NAME=DIMS,...");
  }
  return variants;
}

absl::StatusOr<RequestPool> BuildRequestPool(const PoolOptions& options) {
  if (options.pool_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pool_size: must be at least 1, got ", options.pool_size));
  }
  const std::optional<KeyLengthSite> site = KeyLengthSiteOf(options.rpc);
  for (const auto& [flag, given] :
       {std::pair<absl::string_view, bool>{"lk_range",
                                           options.lk_range.has_value()},
        {"valid_lens_range", options.valid_lens_range.has_value()}}) {
    if (given && !site.has_value()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--%s applies to --rpc attention, additive-attention and "
          "masked-softmax, not %s",
          flag, LoadRpcName(options.rpc)));
    }
  }
  if (options.valid_lens_range && options.request.valid_lens) {
    return absl::InvalidArgumentError(
        "--valid_lens_range and --valid_lens exclude each other");
  }

  RequestPool pool;
  pool.rpc = options.rpc;
  pool.method = LoadRpcMethod(options.rpc);
  absl::Status status;
  switch (options.rpc) {
    case LoadRpc::kScaledDotProductAttention:
      status = BuildEntries<attention::v1::AttentionRequest>(options, &pool);
      break;
    case LoadRpc::kMaskedSoftmax:
      status = BuildEntries<attention::v1::MaskedSoftmaxRequest>(options, &pool);
      break;
    case LoadRpc::kBatchMatmul:
      status = BuildEntries<attention::v1::BatchMatmulRequest>(options, &pool);
      break;
    case LoadRpc::kAdditiveAttention:
      status = BuildEntries<attention::v1::AdditiveAttentionRequest>(options,
                                                                      &pool);
      break;
    case LoadRpc::kNadarayaWatson:
      status =
          BuildEntries<attention::v1::NadarayaWatsonRequest>(options, &pool);
      break;
    case LoadRpc::kFitBandwidth:
      status = BuildEntries<attention::v1::FitBandwidthRequest>(options, &pool);
      break;
    case LoadRpc::kAppendMemory:
      status = BuildEntries<attention::v1::AppendMemoryRequest>(options, &pool);
      break;
    case LoadRpc::kHealth: {
      if (!options.mix.empty()) {
        return absl::InvalidArgumentError(
            "--mix does not apply to --rpc health");
      }
      grpc::health::v1::HealthCheckRequest request;
      request.set_service(options.health_service);
      pool.requests.push_back(request.SerializeAsString());
      pool.bytes = static_cast<int64_t>(pool.requests.back().size());
      pool.variant_counts = {1};
      break;
    }
  }
  if (!status.ok()) return status;
  return pool;
}

}  // namespace attnctl
