// A memory past 2 GiB built by appends and queried exactly (issue #47's
// size goal), against a running attnserve:
//
//   large_memory_check --target=127.0.0.1:8001 [--rows=8388608]
//       [--append_rows=1024] [--samples=1024] [--name=large] [--nobuild]
//
// Makes the memory `name` (d = v = 64, float32, Gaussian score, scale 100)
// by appends of append_rows rows each, no message over a few hundred KiB,
// until it holds `rows` rows (8,388,608: 4 GiB of keys and values, each
// tensor 2 GiB, so rows past 2^31 bytes into a tensor are served too).
// Row i's key spells i in base 16 over its first six coordinates (every two
// keys at least 1 apart, none longer than 37) and its value is (i, 0, ...),
// so a query equal to key j answers j, exactly to float rounding, when row
// j holds its own key and value and sits where it should: the Gaussian
// score of any other row is at least 50 below, a weight under 2e-22. Then
// queries `samples` rows (the first, the last, both sides of the 2 GiB
// boundary, and evenly spread ones) in calls of 256 and checks each
// answer. Prints the time to build, the server's anonymous memory
// (VmRSS less its file pages, from /proc/<pid>/status when --pid is
// given), and the worst error; exits 0 when every answer is its row's.
// --nobuild queries a memory built before (after a restart, say).
#include <sys/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "attention/v1/attention.grpc.pb.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, target, "127.0.0.1:8001", "The server's gRPC address.");
ABSL_FLAG(std::string, name, "large", "The memory to make.");
ABSL_FLAG(int64_t, rows, int64_t{8} << 20, "The rows to grow it to.");
ABSL_FLAG(int64_t, append_rows, 1024, "Rows per append.");
ABSL_FLAG(int64_t, samples, 1024, "Rows to query back.");
ABSL_FLAG(int64_t, pid, 0, "The server's pid, to report its memory.");
ABSL_FLAG(bool, build, true,
          "Build the memory first; false: query the one `name` holds.");

namespace {

namespace v1 = ::attention::v1;
constexpr int kWidth = 64;

// Row i's key: i in base 16 over the first six coordinates.
void KeyOf(int64_t i, float* key) {
  std::fill(key, key + kWidth, 0.0f);
  for (int digit = 0; digit < 6; ++digit) {
    key[digit] = static_cast<float>(i % 16);
    i /= 16;
  }
}

void SetRaw(const std::vector<float>& values, std::vector<int64_t> shape,
            v1::Tensor* tensor) {
  for (int64_t dim : shape) tensor->add_shape(dim);
  tensor->set_raw(values.data(), values.size() * sizeof(float));
}

// The server's resident anonymous memory in MiB (RssAnon), or -1.
double AnonMiB(int64_t pid) {
  if (pid <= 0) return -1;
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("RssAnon:", 0) == 0) {
      return std::stod(line.substr(8)) / 1024.0;
    }
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  const int64_t chunk = absl::GetFlag(FLAGS_append_rows);
  const int64_t pid = absl::GetFlag(FLAGS_pid);
  if (rows < 2 || chunk < 1 || rows > (int64_t{1} << 24)) {
    std::fprintf(stderr, "--rows in [2, 2^24] and --append_rows >= 1\n");
    return 64;
  }
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(64 << 20);
  auto stub = v1::AttentionService::NewStub(
      grpc::CreateCustomChannel(absl::GetFlag(FLAGS_target),
                                grpc::InsecureChannelCredentials(), arguments));

  const absl::Time start = absl::Now();
  double worst_append_ms = 0;
  const int64_t built_before = absl::GetFlag(FLAGS_build) ? 0 : rows;
  for (int64_t first = built_before; first < rows; first += chunk) {
    const int64_t n = std::min(chunk, rows - first);
    std::vector<float> keys(n * kWidth), values(n * kWidth, 0.0f);
    for (int64_t r = 0; r < n; ++r) {
      KeyOf(first + r, &keys[r * kWidth]);
      values[r * kWidth] = static_cast<float>(first + r);
    }
    v1::AppendMemoryRequest request;
    request.set_name(absl::GetFlag(FLAGS_name));
    SetRaw(keys, {n, kWidth}, request.mutable_keys());
    SetRaw(values, {n, kWidth}, request.mutable_values());
    if (first == 0) {
      request.mutable_create()->set_score(v1::SCORE_GAUSSIAN);
      request.mutable_create()->set_scale(100.0f);
    }
    v1::AppendMemoryResponse response;
    grpc::ClientContext context;
    const absl::Time sent = absl::Now();
    const grpc::Status status =
        stub->AppendMemory(&context, request, &response);
    worst_append_ms = std::max(worst_append_ms,
                               absl::ToDoubleMilliseconds(absl::Now() - sent));
    if (!status.ok() || response.rows() != first + n) {
      std::fprintf(stderr, "append at row %ld: %s (rows %ld)\n",
                   static_cast<long>(first), status.error_message().c_str(),
                   static_cast<long>(response.rows()));
      return 1;
    }
  }
  const double built_s = absl::ToDoubleSeconds(absl::Now() - start);
  if (built_before == 0) std::printf(
      "built %ld rows (%.2f GiB of keys and values) by %ld appends "
      "in %.1f s; slowest append %.1f ms; server anonymous memory "
      "%.0f MiB\n",
      static_cast<long>(rows), rows * 2.0 * kWidth * 4 / (1 << 30),
      static_cast<long>((rows + chunk - 1) / chunk), built_s, worst_append_ms,
      AnonMiB(pid));

  // The rows to check: the ends, around 2 GiB into each tensor, spread.
  std::vector<int64_t> wanted = {0, 1, rows - 2, rows - 1};
  const int64_t boundary = (int64_t{1} << 31) / (kWidth * 4);
  for (int64_t i = boundary - 64; i < boundary + 64; ++i) {
    if (i >= 0 && i < rows) wanted.push_back(i);
  }
  const int64_t samples = absl::GetFlag(FLAGS_samples);
  for (int64_t s = 0; s < samples; ++s)
    wanted.push_back(s * (rows - 1) / samples);
  double worst = 0;
  int64_t wrong = 0;
  const absl::Time queried = absl::Now();
  for (size_t at = 0; at < wanted.size(); at += 256) {
    const size_t count = std::min<size_t>(256, wanted.size() - at);
    std::vector<float> queries(count * kWidth);
    for (size_t q = 0; q < count; ++q)
      KeyOf(wanted[at + q], &queries[q * kWidth]);
    v1::AttentionRequest request;
    request.set_memory_name(absl::GetFlag(FLAGS_name));
    SetRaw(queries, {1, static_cast<int64_t>(count), kWidth},
           request.mutable_queries());
    request.set_output_encoding(v1::TENSOR_ENCODING_RAW);
    v1::AttentionResponse response;
    grpc::ClientContext context;
    const grpc::Status status =
        stub->ScaledDotProductAttention(&context, request, &response);
    if (!status.ok()) {
      std::fprintf(stderr, "query: %s\n", status.error_message().c_str());
      return 1;
    }
    const float* out =
        reinterpret_cast<const float*>(response.output().raw().data());
    for (size_t q = 0; q < count; ++q) {
      const double want = static_cast<double>(wanted[at + q]);
      const double error =
          std::abs(out[q * kWidth] - want) / std::max(1.0, want);
      worst = std::max(worst, error);
      if (error > 1e-6) ++wrong;
    }
  }
  std::printf(
      "queried %zu rows (the ends, 128 around 2 GiB into each "
      "tensor, %ld spread) in %.1f s: %ld wrong, worst relative "
      "error %.3g; server anonymous memory %.0f MiB\n",
      wanted.size(), static_cast<long>(samples),
      absl::ToDoubleSeconds(absl::Now() - queried), static_cast<long>(wrong),
      worst, AnonMiB(pid));
  return wrong == 0 ? 0 : 1;
}
