#include "client/load.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention/v1/attention.pb.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"

namespace attnctl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// --- Latency statistics.

TEST(PercentileTest, NearestRankOnKnownData) {
  std::vector<int64_t> sorted(1000);
  std::iota(sorted.begin(), sorted.end(), 1);  // 1..1000
  EXPECT_EQ(Percentile(sorted, 50), 500);
  EXPECT_EQ(Percentile(sorted, 90), 900);
  EXPECT_EQ(Percentile(sorted, 99), 990);
  EXPECT_EQ(Percentile(sorted, 99.9), 999);
  EXPECT_EQ(Percentile(sorted, 100), 1000);
  EXPECT_EQ(Percentile(sorted, 0.01), 1);
  EXPECT_EQ(Percentile({1, 2, 3, 4}, 50), 2);
  EXPECT_EQ(Percentile({1, 2, 3, 4}, 51), 3);
  EXPECT_EQ(Percentile({7}, 99.9), 7);
}

TEST(SummarizeLatenciesTest, SortsAndConvertsToMilliseconds) {
  std::vector<int64_t> nanos;
  for (int i = 100; i >= 1; --i) nanos.push_back(i * 1'000'000);  // 100..1 ms
  const std::optional<LatencySummary> summary = SummarizeLatencies(nanos);
  ASSERT_TRUE(summary.has_value());
  EXPECT_DOUBLE_EQ(summary->p50_ms, 50);
  EXPECT_DOUBLE_EQ(summary->p90_ms, 90);
  EXPECT_DOUBLE_EQ(summary->p99_ms, 99);
  EXPECT_DOUBLE_EQ(summary->p999_ms, 100);
  EXPECT_DOUBLE_EQ(summary->max_ms, 100);
  EXPECT_DOUBLE_EQ(summary->mean_ms, 50.5);
  EXPECT_FALSE(SummarizeLatencies({}).has_value());
}

// --- Arrivals.

TEST(PoissonArrivalsTest, ExponentialGapsWithTheRateAsMean) {
  constexpr double kRate = 2000;  // per second: mean gap 0.5 ms
  constexpr int kDraws = 200000;
  PoissonArrivals arrivals(kRate, /*seed=*/42);
  double sum = 0;
  double sum_of_squares = 0;
  for (int i = 0; i < kDraws; ++i) {
    const double gap = static_cast<double>(arrivals.NextNanos());
    ASSERT_GE(gap, 0);
    sum += gap;
    sum_of_squares += gap * gap;
  }
  const double mean = sum / kDraws;
  const double deviation = std::sqrt(sum_of_squares / kDraws - mean * mean);
  // The mean's standard error is 1/sqrt(200000) = 0.22% of it.
  EXPECT_NEAR(mean, 1e9 / kRate, 0.01 * 1e9 / kRate);
  // Exponential: the standard deviation equals the mean.
  EXPECT_NEAR(deviation / mean, 1.0, 0.02);
}

TEST(PoissonArrivalsTest, SameSeedSameGaps) {
  PoissonArrivals a(100, 7);
  PoissonArrivals b(100, 7);
  PoissonArrivals c(100, 8);
  bool all_equal_to_c = true;
  for (int i = 0; i < 100; ++i) {
    const int64_t gap = a.NextNanos();
    EXPECT_EQ(gap, b.NextNanos());
    all_equal_to_c = all_equal_to_c && gap == c.NextNanos();
  }
  EXPECT_FALSE(all_equal_to_c);
}

// --- Parsing.

TEST(ParseMixTest, ParsesWeightedVariants) {
  absl::StatusOr<std::vector<MixVariant>> mix = ParseMix(
      "queries=1x64x64,keys=1x64x64,values=1x64x64;"
      " 3:queries=1x64x64, keys=1x128x64,values=1x128x64;");
  ASSERT_TRUE(mix.ok()) << mix.status();
  ASSERT_EQ(mix->size(), 2);
  EXPECT_EQ((*mix)[0].weight, 1);
  EXPECT_EQ((*mix)[1].weight, 3);
  ASSERT_EQ((*mix)[1].shapes.size(), 3);
  EXPECT_EQ((*mix)[1].shapes[1].name, "keys");
  EXPECT_THAT((*mix)[1].shapes[1].dims, ElementsAre(1, 128, 64));
  mix = ParseMix("0.5:x=2x3x4");
  ASSERT_TRUE(mix.ok()) << mix.status();
  EXPECT_EQ((*mix)[0].weight, 0.5);
}

TEST(ParseMixTest, RejectsBadVariants) {
  EXPECT_THAT(ParseMix("").status().message(), HasSubstr("no variants"));
  EXPECT_THAT(ParseMix(";;").status().message(), HasSubstr("no variants"));
  EXPECT_THAT(ParseMix("x=2;0:x=3").status().message(),
              HasSubstr("variant 2: weight '0'"));
  EXPECT_THAT(ParseMix("-1:x=3").status().message(), HasSubstr("positive"));
  EXPECT_THAT(ParseMix("w:x=3").status().message(), HasSubstr("positive"));
  EXPECT_THAT(ParseMix("x=2;2:").status().message(),
              HasSubstr("variant 2 has no NAME=DIMS"));
  EXPECT_THAT(ParseMix("x=2;x").status().message(),
              HasSubstr("variant 2: expected NAME=DIMS"));
  EXPECT_THAT(ParseMix("x=2,x=3").status().message(), HasSubstr("twice"));
}

TEST(ParseRangeTest, ParsesAndChecksBounds) {
  absl::StatusOr<IntRange> range = ParseRange("16:128", 1);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->lo, 16);
  EXPECT_EQ(range->hi, 128);
  EXPECT_TRUE(ParseRange("0:0", 0).ok());
  for (const char* bad : {"", "16", "16:", ":16", "a:b", "1:2:3", "9:8"}) {
    EXPECT_FALSE(ParseRange(bad, 0).ok()) << bad;
  }
  EXPECT_FALSE(ParseRange("0:4", 1).ok());
}

TEST(ParseLoadRpcTest, NamesRoundTrip) {
  for (const char* name :
       {"attention", "masked-softmax", "batch-matmul", "additive-attention",
        "nadaraya-watson", "fit-bandwidth", "append", "health"}) {
    absl::StatusOr<LoadRpc> rpc = ParseLoadRpc(name);
    ASSERT_TRUE(rpc.ok()) << name;
    EXPECT_EQ(LoadRpcName(*rpc), name);
  }
  EXPECT_THAT(ParseLoadRpc("softmax").status().message(),
              HasSubstr("expected one of attention, "));
}

// --- Targets.

TEST(IsLoopbackTargetTest, AcceptsOnlyThisMachine) {
  for (const char* target :
       {"localhost:8001", "LOCALHOST:1", "localhost", "127.0.0.1:18500",
        "127.1.2.3:80", "127.0.0.1", "[::1]:8001", "[::1]", "::1",
        "[::ffff:127.0.0.1]:80", "dns:///localhost:8001", "dns:localhost:1",
        "dns:///[::1]:1", "ipv4:127.0.0.1:1,127.0.0.2:2", "ipv6:[::1]:1",
        "unix:/tmp/attnserve.sock", "unix-abstract:attnserve"}) {
    EXPECT_TRUE(IsLoopbackTarget(target)) << target;
  }
  for (const char* target :
       {"", "example.com:80", "10.0.0.1:8001", "0.0.0.0:8001",
        "128.0.0.1:80", "[::]:80", "[::2]:80", "192.168.1.1",
        "127.0.0.1.nip.io:80", "localhost.example.com:80",
        "dns://8.8.8.8/localhost:1", "ipv4:127.0.0.1:1,10.0.0.1:1", "ipv4:",
        "[::1:80", "[::1]x", "[::ffff:10.0.0.1]:80"}) {
    EXPECT_FALSE(IsLoopbackTarget(target)) << target;
  }
}

TEST(CheckLoadOptionsTest, RefusesRemoteTargetsUnlessAllowed) {
  LoadOptions options;
  options.target = "10.1.2.3:8001";
  absl::Status status = CheckLoadOptions(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("--allow_remote"));
  options.allow_remote = true;
  EXPECT_TRUE(CheckLoadOptions(options).ok());
}

TEST(CheckLoadOptionsTest, RejectsInconsistentOptions) {
  LoadOptions options;
  options.target = "127.0.0.1:1";
  ASSERT_TRUE(CheckLoadOptions(options).ok());
  auto message = [](LoadOptions o) {
    return std::string(CheckLoadOptions(o).message());
  };
  LoadOptions o = options;
  o.duration = absl::InfiniteDuration();
  EXPECT_THAT(message(o), HasSubstr("--duration: inf needs --requests"));
  o.requests = 10;
  EXPECT_TRUE(CheckLoadOptions(o).ok());
  o = options;
  o.client_threads = 4;
  o.concurrency = 2;
  EXPECT_THAT(message(o), HasSubstr("--concurrency"));
  o.target_rate = 100;  // open loop: the cap is what is split
  EXPECT_TRUE(CheckLoadOptions(o).ok());
  o.max_in_flight = 3;
  EXPECT_THAT(message(o), HasSubstr("--max_in_flight"));
  o = options;
  o.target_rate = -1;
  EXPECT_THAT(message(o), HasSubstr("--rate"));
  o = options;
  o.warmup = -absl::Seconds(1);
  EXPECT_THAT(message(o), HasSubstr("--warmup"));
  o = options;
  o.retries = 10;
  EXPECT_TRUE(CheckLoadOptions(o).ok());
  o.retries = 11;
  EXPECT_THAT(message(o), HasSubstr("--retries: must be in [0, 10], got 11"));
  o.retries = -1;
  EXPECT_THAT(message(o), HasSubstr("--retries"));
}

// --- Reports.

Report ClosedReport() {
  Report report;
  report.rpc = "attention";
  report.concurrency = 64;
  report.client_threads = 1;
  report.pool_size = 64;
  report.warmup_s = 1;
  report.duration_s = 5.0012;
  report.requests = 1003;
  report.ok = 1000;
  report.throughput_rps = 199.952;
  report.latency = LatencySummary{1.5, 2.25, 3.125, 4.0625, 9.5, 1.75};
  report.errors = {{"INVALID_ARGUMENT", 2}, {"DEADLINE_EXCEEDED", 1}};
  return report;
}

TEST(FormatReportJsonTest, ClosedLoop) {
  EXPECT_EQ(FormatReportJson(ClosedReport()),
            R"({"rpc": "attention", "mode": "closed", "concurrency": 64, )"
            R"("client_threads": 1, "pool_size": 64, "warmup_s": 1, )"
            R"("duration_s": 5.0012, "requests": 1003, "ok": 1000, )"
            R"("throughput_rps": 199.952, "latency_ms": {"p50": 1.5, )"
            R"("p90": 2.25, "p99": 3.125, "p999": 4.0625, "max": 9.5, )"
            R"("mean": 1.75}, "errors": {"DEADLINE_EXCEEDED": 1, )"
            R"("INVALID_ARGUMENT": 2}, "dropped": 0, "retried": 0})");
}

TEST(FormatReportJsonTest, OpenLoopWithoutSuccesses) {
  Report report;
  report.rpc = "health";
  report.open_loop = true;
  report.target_rate = 2000;
  report.max_in_flight = 4096;
  report.client_threads = 2;
  report.pool_size = 1;
  report.warmup_s = 0.5;
  report.duration_s = 2;
  report.requests = 10;
  report.achieved_rate_rps = 1999.5;
  report.send_lag = LatencySummary{0.05, 0.1, 0.2, 0.5, 1, 0.0625};
  report.errors = {{"UNAVAILABLE", 10}};
  report.first_error = "UNAVAILABLE: \"db\" \\ down\n";
  report.dropped = 7;
  report.retried = 3;
  EXPECT_EQ(FormatReportJson(report),
            R"({"rpc": "health", "mode": "open", "target_rate": 2000, )"
            R"("max_in_flight": 4096, "client_threads": 2, "pool_size": 1, )"
            R"("warmup_s": 0.5, "duration_s": 2, "requests": 10, "ok": 0, )"
            R"("throughput_rps": 0, "achieved_rate_rps": 1999.5, )"
            R"("latency_ms": null, "send_lag_ms": {"p50": 0.05, "p90": 0.1, )"
            R"("p99": 0.2, "p999": 0.5, "max": 1, "mean": 0.0625}, )"
            R"("errors": {"UNAVAILABLE": 10}, "dropped": 7, "retried": 3, )"
            R"("first_error": "UNAVAILABLE: \"db\" \\ down\u000a"})");
}

TEST(FormatReportTextTest, NamesTheFigures) {
  const std::string text = FormatReportText(ClosedReport());
  EXPECT_THAT(text, HasSubstr("attention, closed loop: 64 in flight"));
  EXPECT_THAT(text, HasSubstr("1003 completed: 1000 ok, 3 failed"));
  EXPECT_THAT(text, HasSubstr("200.0 req/s"));
  EXPECT_THAT(text, HasSubstr("p99 3.125"));
  EXPECT_THAT(text, HasSubstr("DEADLINE_EXCEEDED 1, INVALID_ARGUMENT 2"));
  Report mixed = ClosedReport();
  mixed.variant_counts = {48, 16};
  EXPECT_THAT(FormatReportText(mixed),
              HasSubstr("64 distinct requests (per --mix variant: 48, 16)"));
}

// --- The request pool.

std::vector<attention::v1::AttentionRequest> AttentionRequests(
    const RequestPool& pool) {
  std::vector<attention::v1::AttentionRequest> requests;
  for (const std::string& bytes : pool.requests) {
    requests.emplace_back();
    EXPECT_TRUE(requests.back().ParseFromString(bytes));
  }
  return requests;
}

TEST(BuildRequestPoolTest, SharesThePoolByWeight) {
  PoolOptions options;
  options.request.generate_missing = true;
  absl::StatusOr<std::vector<MixVariant>> mix =
      ParseMix("3:keys=1x64x8,values=1x64x4;keys=1x128x8,values=1x128x4");
  ASSERT_TRUE(mix.ok()) << mix.status();
  options.mix = *mix;
  absl::StatusOr<std::vector<NamedShape>> shapes = ParseShapes({"queries=1x2x8"});
  ASSERT_TRUE(shapes.ok());
  options.request.shapes = *shapes;
  absl::StatusOr<RequestPool> pool = BuildRequestPool(options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->method,
            "/attention.v1.AttentionService/ScaledDotProductAttention");
  EXPECT_THAT(pool->variant_counts, ElementsAre(48, 16));
  ASSERT_EQ(pool->requests.size(), 64);
  int long_keys = 0;
  std::set<std::string> distinct(pool->requests.begin(), pool->requests.end());
  EXPECT_EQ(distinct.size(), 64);  // every entry has its own seed
  for (const attention::v1::AttentionRequest& request :
       AttentionRequests(*pool)) {
    EXPECT_THAT(request.queries().shape(), ElementsAre(1, 2, 8));
    long_keys += request.keys().shape(1) == 128;
  }
  EXPECT_EQ(long_keys, 16);
}

TEST(BuildRequestPoolTest, DrawsKeyLengthsAndValidLengths) {
  PoolOptions options;
  options.request.generate_missing = true;
  absl::StatusOr<std::vector<NamedShape>> shapes = ParseShapes(
      {"queries=3x1x2", "keys=3x10x2", "values=3x10x4"});
  ASSERT_TRUE(shapes.ok());
  options.request.shapes = *shapes;
  options.lk_range = IntRange{16, 128};
  options.valid_lens_range = IntRange{1, 64};
  absl::StatusOr<RequestPool> pool = BuildRequestPool(options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::set<int64_t> lengths;
  for (const attention::v1::AttentionRequest& request :
       AttentionRequests(*pool)) {
    const int64_t lk = request.keys().shape(1);
    EXPECT_GE(lk, 16);
    EXPECT_LE(lk, 128);
    EXPECT_THAT(request.keys().shape(), ElementsAre(3, lk, 2));
    EXPECT_THAT(request.values().shape(), ElementsAre(3, lk, 4));
    EXPECT_EQ(request.values().values_size(), 3 * lk * 4);
    EXPECT_THAT(request.valid_lens().shape(), ElementsAre(3));
    for (int32_t length : request.valid_lens().values()) {
      EXPECT_GE(length, 1);
      EXPECT_LE(length, std::min<int64_t>(64, lk));
    }
    lengths.insert(lk);
  }
  EXPECT_GT(lengths.size(), 30);  // 64 draws from 113 values
}

TEST(BuildRequestPoolTest, MaskedSoftmaxKeyLengthIsTheLastDimension) {
  PoolOptions options;
  options.rpc = LoadRpc::kMaskedSoftmax;
  options.request.generate_missing = true;
  options.lk_range = IntRange{5, 6};
  options.pool_size = 8;
  absl::StatusOr<RequestPool> pool = BuildRequestPool(options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  for (const std::string& bytes : pool->requests) {
    attention::v1::MaskedSoftmaxRequest request;
    ASSERT_TRUE(request.ParseFromString(bytes));
    EXPECT_EQ(request.x().shape(0), 2);  // the default 2x2x4
    EXPECT_EQ(request.x().shape(1), 2);
    EXPECT_THAT(request.x().shape(2), ::testing::AnyOf(5, 6));
  }
}

TEST(BuildRequestPoolTest, HealthIsOneRequest) {
  PoolOptions options;
  options.rpc = LoadRpc::kHealth;
  options.health_service = "attention.v1.AttentionService";
  absl::StatusOr<RequestPool> pool = BuildRequestPool(options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->method, "/grpc.health.v1.Health/Check");
  ASSERT_EQ(pool->requests.size(), 1);
  grpc::health::v1::HealthCheckRequest request;
  ASSERT_TRUE(request.ParseFromString(pool->requests[0]));
  EXPECT_EQ(request.service(), "attention.v1.AttentionService");
}

TEST(BuildRequestPoolTest, RejectsMisappliedOptions) {
  PoolOptions options;
  options.request.generate_missing = true;
  options.rpc = LoadRpc::kBatchMatmul;
  options.lk_range = IntRange{1, 2};
  EXPECT_THAT(BuildRequestPool(options).status().message(),
              HasSubstr("--lk_range applies to --rpc attention"));
  options = PoolOptions{};
  options.request.generate_missing = true;
  options.valid_lens_range = IntRange{1, 2};
  options.request.valid_lens.emplace();
  EXPECT_THAT(BuildRequestPool(options).status().message(),
              HasSubstr("exclude each other"));
  options = PoolOptions{};
  options.request.generate_missing = true;
  absl::StatusOr<std::vector<MixVariant>> mix = ParseMix("a=2x2");
  ASSERT_TRUE(mix.ok());
  options.mix = *mix;
  EXPECT_THAT(BuildRequestPool(options).status().message(),
              HasSubstr("no tensor 'a'"));
  options = PoolOptions{};
  options.request.generate_missing = true;
  options.pool_size = 0;
  EXPECT_THAT(BuildRequestPool(options).status().message(),
              HasSubstr("--pool_size"));
  options.pool_size = 64;
  options.input_json = "{not json";
  EXPECT_THAT(BuildRequestPool(options).status().message(),
              HasSubstr("--input: not a JSON attention.v1.AttentionRequest"));
}

// --- Running against an in-process server on loopback: the health service
// answers; every other method is taken by a generic service that never
// answers, so its calls end at their deadline.

class LoadRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterAsyncGenericService(&silent_);
    cq_ = builder.AddCompletionQueue();
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    target_ = absl::StrCat("127.0.0.1:", port);
  }

  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now());
    cq_->Shutdown();
    void* tag;
    bool ok;
    while (cq_->Next(&tag, &ok)) {
    }
  }

  LoadOptions Options() const {
    LoadOptions options;
    options.target = target_;
    options.warmup = absl::ZeroDuration();
    options.deadline = absl::Seconds(5);
    return options;
  }

  static RequestPool HealthPool() {
    PoolOptions options;
    options.rpc = LoadRpc::kHealth;
    return *BuildRequestPool(options);
  }

  grpc::AsyncGenericService silent_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
};

TEST_F(LoadRunTest, ClosedLoopSendsExactlyTheRequestsAskedFor) {
  LoadOptions options = Options();
  options.concurrency = 8;
  options.client_threads = 2;
  options.requests = 500;
  options.duration = absl::InfiniteDuration();
  absl::StatusOr<Report> report = RunLoad(options, HealthPool());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->rpc, "health");
  EXPECT_EQ(report->requests, 500);
  EXPECT_EQ(report->ok, 500);
  EXPECT_TRUE(report->errors.empty());
  EXPECT_GT(report->throughput_rps, 0);
  ASSERT_TRUE(report->latency.has_value());
  EXPECT_GT(report->latency->p50_ms, 0);
  EXPECT_LE(report->latency->p50_ms, report->latency->p99_ms);
  EXPECT_LE(report->latency->p99_ms, report->latency->max_ms);
}

TEST_F(LoadRunTest, OpenLoopSendsAtTheTargetRate) {
  LoadOptions options = Options();
  options.target_rate = 1000;
  options.duration = absl::Milliseconds(500);
  absl::StatusOr<Report> report = RunLoad(options, HealthPool());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->open_loop);
  // ~500 Poisson arrivals (standard deviation ~22).
  EXPECT_GT(report->requests, 350);
  EXPECT_LT(report->requests, 650);
  EXPECT_EQ(report->ok, report->requests);
  EXPECT_EQ(report->dropped, 0);
  EXPECT_GT(report->achieved_rate_rps, 700);
  EXPECT_LT(report->achieved_rate_rps, 1300);
  ASSERT_TRUE(report->send_lag.has_value());
  EXPECT_GE(report->send_lag->p50_ms, 0);
}

TEST_F(LoadRunTest, OpenLoopDropsArrivalsOverTheCapAndCountsDeadlines) {
  PoolOptions pool_options;
  pool_options.request.generate_missing = true;
  pool_options.pool_size = 2;
  absl::StatusOr<RequestPool> pool = BuildRequestPool(pool_options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  LoadOptions options = Options();
  options.target_rate = 1000;
  options.max_in_flight = 1;
  options.duration = absl::Milliseconds(200);
  options.deadline = absl::Milliseconds(400);
  absl::StatusOr<Report> report = RunLoad(options, *pool);
  ASSERT_TRUE(report.ok()) << report.status();
  // The one call in flight waits out its deadline; the other ~200 arrivals
  // find the cap full.
  EXPECT_EQ(report->requests, 1);
  EXPECT_EQ(report->ok, 0);
  EXPECT_FALSE(report->latency.has_value());
  EXPECT_EQ(report->errors, (std::map<std::string, int64_t>{
                                {"DEADLINE_EXCEEDED", 1}}));
  EXPECT_THAT(report->first_error, HasSubstr("DEADLINE_EXCEEDED: "));
  EXPECT_GT(report->dropped, 120);
  EXPECT_GE(report->duration_s, 0.4);
}

// A server whose every method answers UNAVAILABLE, except each
// `ok_every`-th call it receives, which it answers OK (its request echoed).
class SometimesUnavailable : public grpc::CallbackGenericService {
 public:
  explicit SometimesUnavailable(int ok_every) : ok_every_(ok_every) {}

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext*) override {
    const bool ok = (calls_.fetch_add(1) + 1) % ok_every_ == 0;
    return new Answer(ok);
  }
  int calls() const { return calls_.load(); }

 private:
  class Answer : public grpc::ServerGenericBidiReactor {
   public:
    explicit Answer(bool ok) : ok_(ok) { StartRead(&request_); }
    void OnReadDone(bool) override {
      if (ok_) {
        StartWriteAndFinish(&request_, grpc::WriteOptions(),
                            grpc::Status::OK);
      } else {
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "not now"));
      }
    }
    void OnDone() override { delete this; }

   private:
    const bool ok_;
    grpc::ByteBuffer request_;
  };
  const int ok_every_;
  std::atomic<int> calls_{0};
};

// Runs `requests` attention calls, one at a time, against a server that
// answers OK to every `ok_every`-th call, resending up to `retries` times.
Report RunAgainstSometimesUnavailable(int ok_every, int retries,
                                      int requests, int* server_calls) {
  SometimesUnavailable service(ok_every);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  PoolOptions pool_options;
  pool_options.request.generate_missing = true;
  pool_options.pool_size = 2;
  absl::StatusOr<RequestPool> pool = BuildRequestPool(pool_options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  LoadOptions options;
  options.target = absl::StrCat("127.0.0.1:", port);
  options.warmup = absl::ZeroDuration();
  options.duration = absl::InfiniteDuration();
  options.requests = requests;
  options.retries = retries;
  absl::StatusOr<Report> report = RunLoad(options, *pool);
  EXPECT_TRUE(report.ok()) << report.status();
  server->Shutdown(std::chrono::system_clock::now());
  *server_calls = service.calls();
  return report.ok() ? *report : Report();
}

TEST(LoadRetryTest, ResendsUnavailableCallsAndCountsTheResends) {
  int server_calls = 0;
  // Every second call answered: each request fails once, then succeeds.
  Report report = RunAgainstSometimesUnavailable(
      /*ok_every=*/2, /*retries=*/1, /*requests=*/50, &server_calls);
  EXPECT_EQ(report.requests, 50);
  EXPECT_EQ(report.ok, 50);
  EXPECT_TRUE(report.errors.empty());
  EXPECT_EQ(report.retried, 50);
  EXPECT_EQ(server_calls, 100);
  EXPECT_THAT(FormatReportText(report),
              HasSubstr("retried     50 resends after UNAVAILABLE"));
}

TEST(LoadRetryTest, GivesUpAfterItsRetriesAndWithoutThemAtOnce) {
  int server_calls = 0;
  Report report = RunAgainstSometimesUnavailable(
      /*ok_every=*/1000, /*retries=*/2, /*requests=*/20, &server_calls);
  EXPECT_EQ(report.requests, 20);
  EXPECT_EQ(report.ok, 0);
  EXPECT_EQ(report.errors, (std::map<std::string, int64_t>{
                               {"UNAVAILABLE", 20}}));
  EXPECT_EQ(report.retried, 40);
  EXPECT_EQ(server_calls, 60);
  EXPECT_THAT(report.first_error, HasSubstr("UNAVAILABLE: not now"));

  report = RunAgainstSometimesUnavailable(
      /*ok_every=*/2, /*retries=*/0, /*requests=*/20, &server_calls);
  EXPECT_EQ(report.ok, 10);
  EXPECT_EQ(report.errors, (std::map<std::string, int64_t>{
                               {"UNAVAILABLE", 10}}));
  EXPECT_EQ(report.retried, 0);
  EXPECT_EQ(server_calls, 20);
}

TEST_F(LoadRunTest, RefusesToStartWithoutAServer) {
  LoadOptions options = Options();
  options.target = "127.0.0.1:1";  // nothing listens on port 1
  options.deadline = absl::Milliseconds(300);
  EXPECT_EQ(RunLoad(options, HealthPool()).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace attnctl
