// Running the load: the per-thread drivers (closed and open loop) and
// RunLoad, which starts them and folds what they saw into a Report.
//
// The drivers stay private to this file: they are RunLoad's machinery, not
// an API, and tests/CMakeLists.txt's thread_safety_analysis compiles this
// file to check their locking.
#include "client/load.h"

#include <sys/prctl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/alarm.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace attnctl {
namespace {

using Clock = std::chrono::steady_clock;

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
  int64_t retried = 0;  // resends of measured calls that ended UNAVAILABLE
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
    size_t request = 0;  // its index in requests_, sent again on a retry
    int retries = 0;     // resends so far
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
    call->request = next_request_;
    call->retries = 0;
    if (++next_request_ == requests_.size()) next_request_ = 0;
    Send(call);
  }

  // Sends the call's request; its completion arrives on cq_ tagged `call`.
  void Send(Call* call) {
    call->context.emplace();
    if (options_.deadline != absl::InfiniteDuration()) {
      call->context->set_deadline(
          absl::ToChronoTime(absl::Now() + options_.deadline));
    }
    call->reader = stub_.PrepareUnaryCall(&*call->context, method_,
                                          requests_[call->request], &cq_);
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
        const bool retry =
            call->status.error_code() == grpc::StatusCode::UNAVAILABLE &&
            call->retries < options_.retries;
        if (!retry) Record(*call, Clock::now());
        call->reader.reset();
        call->context.reset();
        call->response.Clear();
        if (retry) {
          ++call->retries;
          if (call->measured) ++result_.retried;
          Send(call);  // still in flight, from the same origin
          continue;
        }
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

}  // namespace

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
  // A server that answers UNAVAILABLE to everything must still end the run.
  if (options.retries < 0 || options.retries > 10) {
    return invalid("retries",
                   absl::StrCat("must be in [0, 10], got ", options.retries));
  }
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
    report.retried += result.retried;
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

}  // namespace attnctl
