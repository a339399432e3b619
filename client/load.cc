#include "client/load.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "attention/v1/attention.grpc.pb.h"
#include "client/tensors.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/alarm.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace attnctl {
namespace {

using Clock = std::chrono::steady_clock;

// --- RPC names.

struct RpcName {
  LoadRpc rpc;
  absl::string_view name;    // the attnctl subcommand
  absl::string_view method;  // in attention.v1.AttentionService
};

constexpr RpcName kRpcNames[] = {
    {LoadRpc::kAttention, "attention", "ScaledDotProductAttention"},
    {LoadRpc::kMaskedSoftmax, "masked-softmax", "MaskedSoftmax"},
    {LoadRpc::kBatchMatmul, "batch-matmul", "BatchMatmul"},
    {LoadRpc::kAdditiveAttention, "additive-attention", "AdditiveAttention"},
    {LoadRpc::kNadarayaWatson, "nadaraya-watson", "NadarayaWatson"},
    {LoadRpc::kFitBandwidth, "fit-bandwidth", "FitBandwidth"},
    {LoadRpc::kHealth, "health", "Check"},
};

std::string MethodOf(LoadRpc rpc) {
  for (const RpcName& entry : kRpcNames) {
    if (entry.rpc != rpc) continue;
    if (rpc == LoadRpc::kHealth) {
      return absl::StrCat("/", grpc::health::v1::Health::service_full_name(),
                          "/", entry.method);
    }
    return absl::StrCat("/", attention::v1::AttentionService::service_full_name(),
                        "/", entry.method);
  }
  return "";
}

// --- The pool.

// Where --lk_range and --valid_lens_range act in an RPC's request.
struct KeyLengthSite {
  std::vector<absl::string_view> tensors;  // whose dimension `axis` is Lk
  int axis = -2;                           // from the end
  absl::string_view batch_tensor;          // whose dimension 0 is B
};

std::optional<KeyLengthSite> KeyLengthSiteOf(LoadRpc rpc) {
  switch (rpc) {
    case LoadRpc::kAttention:
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

// --- Targets.

bool IsLoopbackHost(absl::string_view host) {
  if (absl::EqualsIgnoreCase(host, "localhost") ||
      absl::EqualsIgnoreCase(host, "localhost.")) {
    return true;
  }
  const std::string text(host);
  in_addr v4;
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6) ||
           (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;
}

// The host of "host", "host:port", "[v6]", "[v6]:port" or a bare IPv6
// address; nullopt when malformed.
std::optional<absl::string_view> HostOf(absl::string_view address) {
  if (address.empty()) return std::nullopt;
  if (address[0] == '[') {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos) return std::nullopt;
    const absl::string_view rest = address.substr(close + 1);
    if (!rest.empty() && rest[0] != ':') return std::nullopt;
    return address.substr(1, close - 1);
  }
  const size_t colons = std::count(address.begin(), address.end(), ':');
  if (colons == 1) return address.substr(0, address.find(':'));
  return address;  // no port, or a bare IPv6 address
}

// --- Running.

struct Schedule {
  Clock::time_point start;
  Clock::time_point measure_from;  // the warm-up's end
  Clock::time_point stop_at;       // time_point::max() for no time limit
};

// What one Driver saw of the measured requests.
struct DriverResult {
  std::vector<int64_t> latencies;  // nanoseconds, successful calls
  int64_t requests = 0;
  int64_t ok = 0;
  std::array<int64_t, 17> errors{};  // by grpc::StatusCode
  std::string first_error;
  bool completed_any = false;
  Clock::time_point last_completion;
  // Open loop, written by the sender.
  std::vector<int64_t> send_lags;  // nanoseconds, measured requests
  int64_t sent = 0;
  int64_t dropped = 0;
  Clock::time_point stopped_sending;
};

// One client thread: a channel, a completion queue and the calls on it.
//
// Closed loop: Run() starts `slots` calls and, on each completion, starts the
// next in the same slot until the schedule or the request budget says stop.
// Open loop: Run() starts a sender thread that issues calls at Poisson
// arrival times (at most `slots` in flight) while Run() reaps completions.
// Run() returns when sending has stopped and no call is in flight.
//
// Thread-compatible from outside: construct, Connect(), Run() on one thread,
// then read result().
class Driver {
 public:
  Driver(const LoadOptions& options, const std::string& method,
         const std::vector<grpc::ByteBuffer>& requests, int index, int slots,
         double rate, const Schedule* schedule, std::atomic<int64_t>* budget)
      : options_(options),
        method_(method),
        requests_(requests),
        next_request_(requests.size() * index /
                      std::max(options.client_threads, 1)),
        slots_(slots),
        rate_(rate),
        seed_(uint64_t{options.seed} * 1000003 + index),
        schedule_(schedule),
        budget_(budget),
        channel_(Channel(options)),
        stub_(channel_) {}

  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  // Blocks until connected or `timeout` passed; false then.
  bool Connect(absl::Duration timeout) {
    return channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout));
  }

  void Run() {
    if (rate_ > 0) {
      std::thread sender([this] { SendOnSchedule(); });
      Reap();
      sender.join();
    } else {
      for (int slot = 0; slot < slots_; ++slot) {
        calls_.push_back(std::make_unique<Call>());
      }
      {
        absl::MutexLock lock(&mu_);
        sending_done_ = true;  // no sender: completions start the next calls
      }
      int started = 0;
      for (const std::unique_ptr<Call>& call : calls_) {
        started += StartNext(call.get());
      }
      {
        absl::MutexLock lock(&mu_);
        in_flight_ = started;
      }
      if (started > 0) Reap();
    }
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  DriverResult& result() { return result_; }

 private:
  struct Call {
    std::optional<grpc::ClientContext> context;
    std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
    grpc::ByteBuffer response;
    grpc::Status status;
    Clock::time_point origin;  // latency is measured from here
    bool measured = false;
  };

  static std::shared_ptr<grpc::Channel> Channel(const LoadOptions& options) {
    grpc::ChannelArguments arguments;
    arguments.SetMaxReceiveMessageSize(options.max_receive_bytes);
    // A connection of its own per thread, not one shared by every channel
    // to the same target.
    arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    if (!options.server_name.empty()) {
      arguments.SetSslTargetNameOverride(options.server_name);
    }
    return grpc::CreateCustomChannel(
        options.target,
        options.credentials != nullptr ? options.credentials
                                       : grpc::InsecureChannelCredentials(),
        arguments);
  }

  // Takes one measured request from the budget; false when it is spent.
  bool ClaimBudget() {
    return options_.requests == 0 ||
           budget_->fetch_sub(1, std::memory_order_relaxed) > 0;
  }

  void Start(Call* call, Clock::time_point origin, bool measured) {
    call->origin = origin;
    call->measured = measured;
    call->context.emplace();
    if (options_.deadline != absl::InfiniteDuration()) {
      call->context->set_deadline(
          absl::ToChronoTime(absl::Now() + options_.deadline));
    }
    call->reader = stub_.PrepareUnaryCall(&*call->context, method_,
                                          requests_[next_request_], &cq_);
    if (++next_request_ == requests_.size()) next_request_ = 0;
    call->reader->StartCall();
    call->reader->Finish(&call->response, &call->status, call);
  }

  // Closed loop: starts the slot's next call unless it is time to stop.
  bool StartNext(Call* call) {
    const Clock::time_point now = Clock::now();
    if (now >= schedule_->stop_at) return false;
    const bool measured = now >= schedule_->measure_from;
    if (measured && !ClaimBudget()) return false;
    Start(call, now, measured);
    return true;
  }

  void Record(const Call& call, Clock::time_point now) {
    if (!call.status.ok() && result_.first_error.empty()) {
      result_.first_error = absl::StrCat(
          absl::StatusCodeToString(
              static_cast<absl::StatusCode>(call.status.error_code())),
          ": ", call.status.error_message());
    }
    if (!call.measured) return;
    ++result_.requests;
    if (call.status.ok()) {
      ++result_.ok;
      result_.latencies.push_back(
          std::chrono::duration_cast<std::chrono::nanoseconds>(now -
                                                               call.origin)
              .count());
    } else {
      const size_t code = static_cast<size_t>(call.status.error_code());
      ++result_.errors[std::min(code, result_.errors.size() - 1)];
    }
    result_.completed_any = true;
    result_.last_completion = std::max(result_.last_completion, now);
  }

  // Takes completions until sending is done and nothing is in flight.
  void Reap() {
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
      if (tag != &wake_tag_) {
        Call* call = static_cast<Call*>(tag);
        Record(*call, Clock::now());
        call->reader.reset();
        call->context.reset();
        call->response.Clear();
        if (rate_ == 0 && StartNext(call)) continue;
        absl::MutexLock lock(&mu_);
        --in_flight_;
        if (rate_ > 0) free_.push_back(call);
      }
      absl::MutexLock lock(&mu_);
      if (sending_done_ && in_flight_ == 0) return;
    }
  }

  // Open loop: a free call, or nullptr when `slots_` are in flight.
  Call* TakeCall() {
    Call* call = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (in_flight_ >= slots_) return nullptr;
      ++in_flight_;
      if (!free_.empty()) {
        call = free_.back();
        free_.pop_back();
      }
    }
    if (call == nullptr) {  // fewer than slots_ exist: make one
      calls_.push_back(std::make_unique<Call>());
      call = calls_.back().get();
    }
    return call;
  }

  void ReturnCall(Call* call) {
    absl::MutexLock lock(&mu_);
    --in_flight_;
    free_.push_back(call);
  }

  // Open loop, on the sender thread.
  void SendOnSchedule() {
    // Wake up on time: the default 50 us timer slack would be send lag.
    prctl(PR_SET_TIMERSLACK, 1UL);
    PoissonArrivals arrivals(rate_, seed_);
    Clock::time_point arrival = schedule_->start;
    Clock::time_point stopped = schedule_->stop_at;
    while (true) {
      arrival += std::chrono::nanoseconds(arrivals.NextNanos());
      if (arrival >= schedule_->stop_at) break;
      if (arrival > Clock::now()) std::this_thread::sleep_until(arrival);
      const bool measured = arrival >= schedule_->measure_from;
      Call* call = TakeCall();
      if (call == nullptr) {
        if (measured) ++result_.dropped;
        continue;
      }
      if (measured && !ClaimBudget()) {
        ReturnCall(call);
        stopped = Clock::now();
        break;
      }
      if (measured) {
        ++result_.sent;
        result_.send_lags.push_back(
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() -
                                                                 arrival)
                .count());
      }
      Start(call, arrival, measured);
    }
    result_.stopped_sending = stopped;
    // The alarm wakes Reap() when nothing is in flight; it is set before
    // sending_done_ so that Reap() cannot return and shut the queue down
    // first.
    absl::MutexLock lock(&mu_);
    wake_.Set(&cq_, std::chrono::system_clock::now(), &wake_tag_);
    sending_done_ = true;
  }

  const LoadOptions& options_;
  const std::string& method_;
  const std::vector<grpc::ByteBuffer> requests_;  // shares the pool's bytes
  size_t next_request_;  // used by the one thread that starts calls
  const int slots_;      // closed: concurrency; open: the in-flight cap
  const double rate_;    // open loop when > 0
  const uint64_t seed_;
  const Schedule* const schedule_;
  std::atomic<int64_t>* const budget_;
  const std::shared_ptr<grpc::Channel> channel_;
  grpc::GenericStub stub_;
  grpc::CompletionQueue cq_;
  grpc::Alarm wake_;
  char wake_tag_ = 0;

  // Touched by the thread that starts calls only (the sender in the open
  // loop); reaped calls come back through free_.
  std::vector<std::unique_ptr<Call>> calls_;
  // The reaper's, except for sent/dropped/stopped_sending (the sender's).
  DriverResult result_;

  absl::Mutex mu_;
  std::vector<Call*> free_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool sending_done_ ABSL_GUARDED_BY(mu_) = false;
};

// `total` split into `parts` shares differing by at most one.
std::vector<int> Split(int total, int parts) {
  std::vector<int> shares(parts, total / parts);
  for (int i = 0; i < total % parts; ++i) ++shares[i];
  return shares;
}

double Seconds(Clock::duration duration) {
  return std::chrono::duration<double>(duration).count();
}

double Millis(int64_t nanos) { return static_cast<double>(nanos) / 1e6; }

// A JSON number: at most 6 significant digits; null when not finite.
std::string JsonNumber(double value) {
  if (!std::isfinite(value)) return "null";
  return absl::StrFormat("%.6g", value);
}

// A JSON string literal: quotes, backslashes and control characters escaped.
std::string JsonString(absl::string_view text) {
  std::string quoted = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      quoted += '\\';
      quoted += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&quoted, "\\u%04x", static_cast<int>(c));
    } else {
      quoted += c;
    }
  }
  quoted += '"';
  return quoted;
}

std::string JsonLatency(const std::optional<LatencySummary>& latency) {
  if (!latency.has_value()) return "null";
  return absl::StrFormat(
      R"({"p50": %s, "p90": %s, "p99": %s, "p999": %s, "max": %s, )"
      R"("mean": %s})",
      JsonNumber(latency->p50_ms), JsonNumber(latency->p90_ms),
      JsonNumber(latency->p99_ms), JsonNumber(latency->p999_ms),
      JsonNumber(latency->max_ms), JsonNumber(latency->mean_ms));
}

std::string Plural(int64_t count, absl::string_view noun) {
  return absl::StrCat(count, " ", noun, count == 1 ? "" : "s");
}

}  // namespace

absl::StatusOr<LoadRpc> ParseLoadRpc(absl::string_view text) {
  std::vector<absl::string_view> names;
  for (const RpcName& entry : kRpcNames) {
    if (entry.name == text) return entry.rpc;
    names.push_back(entry.name);
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "expected one of %s, got '%s'", absl::StrJoin(names, ", "), text));
}

absl::string_view LoadRpcName(LoadRpc rpc) {
  for (const RpcName& entry : kRpcNames) {
    if (entry.rpc == rpc) return entry.name;
  }
  return "";
}

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
  pool.method = MethodOf(options.rpc);
  absl::Status status;
  switch (options.rpc) {
    case LoadRpc::kAttention:
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

absl::Status CheckLoadOptions(const LoadOptions& options) {
  auto invalid = [](absl::string_view flag, absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", message));
  };
  if (options.target.empty()) return invalid("target", "empty");
  if (!options.allow_remote && !IsLoopbackTarget(options.target)) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "--target %s is not a loopback address (127.0.0.0/8, localhost, "
        "[::1]); pass --allow_remote to load another machine on purpose",
        options.target));
  }
  if (options.client_threads < 1 || options.client_threads > 64) {
    return invalid("client_threads",
                   absl::StrCat("must be in [1, 64], got ",
                                options.client_threads));
  }
  if (!std::isfinite(options.target_rate) || options.target_rate < 0) {
    return invalid("rate", "must be a non-negative number");
  }
  if (options.target_rate > 0) {
    if (options.max_in_flight < options.client_threads) {
      return invalid("max_in_flight",
                     absl::StrCat("must be at least --client_threads (",
                                  options.client_threads, "), got ",
                                  options.max_in_flight));
    }
  } else if (options.concurrency < options.client_threads ||
             options.concurrency > (1 << 20)) {
    return invalid("concurrency",
                   absl::StrCat("must be in [--client_threads (",
                                options.client_threads, "), 2^20], got ",
                                options.concurrency));
  }
  if (options.duration <= absl::ZeroDuration()) {
    return invalid("duration", "must be positive");
  }
  if (options.duration == absl::InfiniteDuration() && options.requests == 0) {
    return invalid("duration", "inf needs --requests");
  }
  if (options.requests < 0) return invalid("requests", "must be >= 0");
  if (options.warmup < absl::ZeroDuration() ||
      options.warmup == absl::InfiniteDuration()) {
    return invalid("warmup", "must be finite and >= 0");
  }
  if (options.deadline <= absl::ZeroDuration()) {
    return invalid("deadline", "must be positive");
  }
  if (options.max_receive_bytes <= 0) {
    return invalid("max_message_bytes", "must be positive");
  }
  return absl::OkStatus();
}

bool IsLoopbackTarget(absl::string_view target) {
  if (absl::StartsWith(target, "unix:") ||
      absl::StartsWith(target, "unix-abstract:")) {
    return true;  // a socket on this machine
  }
  bool list = false;
  if (absl::ConsumePrefix(&target, "ipv4:") ||
      absl::ConsumePrefix(&target, "ipv6:")) {
    list = true;
  } else if (!absl::ConsumePrefix(&target, "dns:")) {
    // No scheme gRPC knows: it reads the target as dns:///target.
    const std::optional<absl::string_view> host = HostOf(target);
    return host.has_value() && IsLoopbackHost(*host);
  }
  if (absl::ConsumePrefix(&target, "//")) {
    // An authority (dns: a name server to ask) is not ours to trust.
    if (!absl::ConsumePrefix(&target, "/")) return false;
  }
  if (!list) {
    const std::optional<absl::string_view> host = HostOf(target);
    return host.has_value() && IsLoopbackHost(*host);
  }
  if (target.empty()) return false;
  for (absl::string_view address : absl::StrSplit(target, ',')) {
    const std::optional<absl::string_view> host = HostOf(address);
    if (!host.has_value() || !IsLoopbackHost(*host)) return false;
  }
  return true;
}

int64_t Percentile(const std::vector<int64_t>& sorted, double p) {
  const double n = static_cast<double>(sorted.size());
  const int64_t rank = static_cast<int64_t>(std::ceil(p / 100.0 * n - 1e-6));
  const int64_t index =
      std::clamp<int64_t>(rank - 1, 0, static_cast<int64_t>(sorted.size()) - 1);
  return sorted[index];
}

std::optional<LatencySummary> SummarizeLatencies(std::vector<int64_t> nanos) {
  if (nanos.empty()) return std::nullopt;
  std::sort(nanos.begin(), nanos.end());
  LatencySummary summary;
  summary.p50_ms = Millis(Percentile(nanos, 50));
  summary.p90_ms = Millis(Percentile(nanos, 90));
  summary.p99_ms = Millis(Percentile(nanos, 99));
  summary.p999_ms = Millis(Percentile(nanos, 99.9));
  summary.max_ms = Millis(nanos.back());
  long double sum = 0;
  for (int64_t value : nanos) sum += value;
  summary.mean_ms = Millis(static_cast<int64_t>(sum / nanos.size()));
  return summary;
}

absl::StatusOr<Report> RunLoad(const LoadOptions& options,
                               const RequestPool& pool) {
  if (absl::Status status = CheckLoadOptions(options); !status.ok()) {
    return status;
  }
  if (pool.requests.empty()) {
    return absl::InvalidArgumentError("the request pool is empty");
  }
  // The pool's bytes once; every driver's copies share them.
  std::vector<grpc::ByteBuffer> requests;
  requests.reserve(pool.requests.size());
  for (const std::string& bytes : pool.requests) {
    grpc::Slice slice(bytes);
    requests.emplace_back(&slice, 1);
  }

  const bool open_loop = options.target_rate > 0;
  const int threads = options.client_threads;
  const std::vector<int> slots = Split(
      open_loop ? options.max_in_flight : options.concurrency, threads);
  std::atomic<int64_t> budget(options.requests);
  Schedule schedule;
  std::vector<std::unique_ptr<Driver>> drivers;
  for (int i = 0; i < threads; ++i) {
    drivers.push_back(std::make_unique<Driver>(
        options, pool.method, requests, i, slots[i],
        open_loop ? options.target_rate / threads : 0.0, &schedule, &budget));
  }
  const absl::Duration connect_timeout =
      std::min(options.deadline, absl::Seconds(30));
  for (const std::unique_ptr<Driver>& driver : drivers) {
    if (!driver->Connect(connect_timeout)) {
      return absl::UnavailableError(
          absl::StrFormat("cannot connect to %s within %s", options.target,
                          absl::FormatDuration(connect_timeout)));
    }
  }

  schedule.start = Clock::now();
  schedule.measure_from =
      schedule.start + absl::ToChronoNanoseconds(options.warmup);
  schedule.stop_at =
      options.duration == absl::InfiniteDuration()
          ? Clock::time_point::max()
          : schedule.measure_from + absl::ToChronoNanoseconds(options.duration);
  std::vector<std::thread> running;
  for (const std::unique_ptr<Driver>& driver : drivers) {
    running.emplace_back([&driver] { driver->Run(); });
  }
  for (std::thread& thread : running) thread.join();

  Report report;
  report.rpc = std::string(LoadRpcName(pool.rpc));
  report.open_loop = open_loop;
  report.concurrency = open_loop ? 0 : options.concurrency;
  report.target_rate = open_loop ? options.target_rate : 0;
  report.max_in_flight = open_loop ? options.max_in_flight : 0;
  report.client_threads = threads;
  report.pool_size = static_cast<int>(pool.requests.size());
  report.variant_counts = pool.variant_counts;
  report.warmup_s = absl::ToDoubleSeconds(options.warmup);
  std::vector<int64_t> latencies;
  Clock::time_point last_completion = schedule.measure_from;
  Clock::time_point stopped_sending = schedule.measure_from;
  for (const std::unique_ptr<Driver>& driver : drivers) {
    DriverResult& result = driver->result();
    latencies.insert(latencies.end(), result.latencies.begin(),
                     result.latencies.end());
    result.latencies = {};
    report.requests += result.requests;
    report.ok += result.ok;
    report.dropped += result.dropped;
    for (size_t code = 0; code < result.errors.size(); ++code) {
      if (result.errors[code] == 0) continue;
      report.errors[absl::StatusCodeToString(
          static_cast<absl::StatusCode>(code))] += result.errors[code];
    }
    if (report.first_error.empty()) report.first_error = result.first_error;
    if (result.completed_any) {
      last_completion = std::max(last_completion, result.last_completion);
    }
    if (open_loop) {
      stopped_sending = std::max(stopped_sending, result.stopped_sending);
    }
  }
  report.duration_s = Seconds(last_completion - schedule.measure_from);
  if (report.duration_s > 0) {
    report.throughput_rps = report.ok / report.duration_s;
  }
  if (open_loop) {
    int64_t sent = 0;
    std::vector<int64_t> send_lags;
    for (const std::unique_ptr<Driver>& driver : drivers) {
      DriverResult& result = driver->result();
      sent += result.sent;
      send_lags.insert(send_lags.end(), result.send_lags.begin(),
                       result.send_lags.end());
      result.send_lags = {};
    }
    const double sending_s = Seconds(stopped_sending - schedule.measure_from);
    if (sending_s > 0) report.achieved_rate_rps = sent / sending_s;
    report.send_lag = SummarizeLatencies(std::move(send_lags));
  }
  report.latency = SummarizeLatencies(std::move(latencies));
  return report;
}

std::string FormatReportText(const Report& report) {
  std::string text;
  const std::string threads = Plural(report.client_threads, "client thread");
  if (report.open_loop) {
    absl::StrAppendFormat(&text,
                          "load        %s, open loop: %s req/s Poisson, at "
                          "most %d in flight, %s\n",
                          report.rpc, JsonNumber(report.target_rate),
                          report.max_in_flight, threads);
  } else {
    absl::StrAppendFormat(&text,
                          "load        %s, closed loop: %d in flight, %s\n",
                          report.rpc, report.concurrency, threads);
  }
  absl::StrAppendFormat(&text, "pool        %s",
                        Plural(report.pool_size, "distinct request"));
  if (report.variant_counts.size() > 1) {
    absl::StrAppendFormat(&text, " (per --mix variant: %s)",
                          absl::StrJoin(report.variant_counts, ", "));
  }
  text += "\n";
  absl::StrAppendFormat(&text, "window      %.3f s after %s s of warm-up\n",
                        report.duration_s, JsonNumber(report.warmup_s));
  absl::StrAppendFormat(&text, "requests    %d completed: %d ok, %d failed\n",
                        report.requests, report.ok,
                        report.requests - report.ok);
  absl::StrAppendFormat(&text, "throughput  %.1f req/s ok\n",
                        report.throughput_rps);
  if (report.open_loop) {
    absl::StrAppendFormat(
        &text, "rate        %.1f req/s sent of %s target; %d dropped at the cap\n",
        report.achieved_rate_rps, JsonNumber(report.target_rate),
        report.dropped);
  }
  if (report.latency.has_value()) {
    const LatencySummary& l = *report.latency;
    absl::StrAppendFormat(&text,
                          "latency ms  p50 %.3f  p90 %.3f  p99 %.3f  p99.9 "
                          "%.3f  max %.3f  mean %.3f%s\n",
                          l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms,
                          l.mean_ms,
                          report.open_loop ? "  (from scheduled arrival)" : "");
  } else {
    text += "latency ms  none: no request succeeded\n";
  }
  if (report.send_lag.has_value()) {
    absl::StrAppendFormat(&text,
                          "send lag ms p50 %.3f  p99 %.3f  max %.3f  (sent "
                          "after the scheduled arrival)\n",
                          report.send_lag->p50_ms, report.send_lag->p99_ms,
                          report.send_lag->max_ms);
  }
  if (!report.errors.empty()) {
    std::vector<std::string> errors;
    for (const auto& [code, count] : report.errors) {
      errors.push_back(absl::StrCat(code, " ", count));
    }
    absl::StrAppendFormat(&text, "errors      %s\n",
                          absl::StrJoin(errors, ", "));
  }
  if (!report.first_error.empty()) {
    absl::StrAppendFormat(&text, "first error %s\n", report.first_error);
  }
  return text;
}

std::string FormatReportJson(const Report& report) {
  std::string json = absl::StrFormat(R"({"rpc": "%s", "mode": "%s", )",
                                     report.rpc,
                                     report.open_loop ? "open" : "closed");
  if (report.open_loop) {
    absl::StrAppendFormat(&json, R"("target_rate": %s, "max_in_flight": %d, )",
                          JsonNumber(report.target_rate), report.max_in_flight);
  } else {
    absl::StrAppendFormat(&json, R"("concurrency": %d, )", report.concurrency);
  }
  absl::StrAppendFormat(
      &json,
      R"("client_threads": %d, "pool_size": %d, "warmup_s": %s, )"
      R"("duration_s": %s, "requests": %d, "ok": %d, "throughput_rps": %s, )",
      report.client_threads, report.pool_size, JsonNumber(report.warmup_s),
      JsonNumber(report.duration_s), report.requests, report.ok,
      JsonNumber(report.throughput_rps));
  if (report.open_loop) {
    absl::StrAppendFormat(&json, R"("achieved_rate_rps": %s, )",
                          JsonNumber(report.achieved_rate_rps));
  }
  absl::StrAppendFormat(&json, R"("latency_ms": %s, )",
                        JsonLatency(report.latency));
  if (report.open_loop) {
    absl::StrAppendFormat(&json, R"("send_lag_ms": %s, )",
                          JsonLatency(report.send_lag));
  }
  std::vector<std::string> errors;
  for (const auto& [code, count] : report.errors) {
    errors.push_back(absl::StrFormat(R"("%s": %d)", code, count));
  }
  absl::StrAppendFormat(&json, R"("errors": {%s}, "dropped": %d)",
                        absl::StrJoin(errors, ", "), report.dropped);
  if (!report.first_error.empty()) {
    absl::StrAppendFormat(&json, R"(, "first_error": %s)",
                          JsonString(report.first_error));
  }
  json += "}";
  return json;
}

PoissonArrivals::PoissonArrivals(double rate_per_second, uint64_t seed)
    : rng_(seed), seconds_(rate_per_second) {}

int64_t PoissonArrivals::NextNanos() {
  return std::llround(seconds_(rng_) * 1e9);
}

}  // namespace attnctl
