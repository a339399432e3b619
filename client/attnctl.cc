// attnctl: the command-line client of attnserve. It talks only to the wire
// (proto/), never to lib/.
//
//   attnctl [flags] SUBCOMMAND
//
// One subcommand per RPC of attention.v1.AttentionService, plus `health`.
// A subcommand builds its request (from --input JSON and/or generated random
// tensors, then the request flags), calls the server with --deadline, and
// prints the response as one line of JSON on stdout.
//
// `load` drives one of those RPCs at a loopback server for a while and
// reports throughput and latency (client/load.h).
//
// Exit status: 0 on success; 1 for a usage error (unknown subcommand, bad
// flag value, unreadable or invalid --input) and for `health` answering
// anything but SERVING; 2 when the RPC fails, after printing
// "attnctl: <CODE>: <message>" to stderr. `load` exits 0 when it ran, even
// with failed calls, and 2 when no call succeeded.
//
// Flags live in this file only; the rest of client/ takes plain structs.

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "attention/v1/attention.grpc.pb.h"
#include "client/credentials.h"
#include "client/load.h"
#include "client/printer.h"
#include "client/requests.h"
#include "client/server_address.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

// --- Connection flags, for every subcommand.
ABSL_FLAG(std::string, target, "localhost:8001",
          "The server's address, host:port.");
ABSL_FLAG(absl::Duration, deadline, absl::Seconds(10),
          "Deadline of the call, like 500ms, 10s or 2m.");
ABSL_FLAG(int32_t, max_message_bytes, 256 << 20,
          "The largest response accepted, in bytes.");
ABSL_FLAG(bool, tls, false,
          "Connect with TLS, checking the server's certificate against "
          "--ca, or the system's trusted roots without it. Implied by --ca, "
          "--cert and --server_name.");
ABSL_FLAG(std::string, ca, "", "PEM CA certificates to trust (TLS).");
ABSL_FLAG(std::string, cert, "",
          "PEM client certificate to present (mutual TLS); with --key.");
ABSL_FLAG(std::string, key, "", "PEM private key of --cert.");
ABSL_FLAG(std::string, server_name, "",
          "The name to check the server's certificate against (and send as "
          "SNI), when it differs from --target's host.");
ABSL_FLAG(std::string, token, "",
          "Bearer token, sent as `authorization: Bearer <token>` on every "
          "call; needs TLS. Health checks need none.");

// --- health.
ABSL_FLAG(
    std::string, service, "",
    "health: the service to ask about, like attention.v1.AttentionService; "
    "empty asks about the server as a whole.");
ABSL_FLAG(std::string, target_from_cmdline, "",
          "health: instead of --target, check the attnserve whose command "
          "line is in this file, like /proc/1/cmdline in its container: its "
          "--grpc_port (default 8001) on loopback, or its --host if that is "
          "not a wildcard. The image's HEALTHCHECK uses it.");

// --- Where the request comes from, and how the response is printed.
ABSL_FLAG(std::string, input, "",
          "Read the request from this file ('-': stdin), in protobuf's JSON "
          "mapping of the request message, instead of generating it. Request "
          "flags given too override its fields; --shape replaces its tensors.");
ABSL_FLAG(std::vector<std::string>, shape, {},
          "NAME=DIMS, repeated or comma-separated, like "
          "queries=2x1x2,keys=2x10x2: generate request tensor NAME with shape "
          "DIMS and random data.");
ABSL_FLAG(uint32_t, seed, 0, "Seed of the generated data (std::mt19937).");
ABSL_FLAG(std::string, encoding, "",
          "values | raw: how the request's tensors travel, and the "
          "output_encoding asked of the server (default values).");
ABSL_FLAG(bool, print_raw, false,
          "Print raw response tensors as base64 `raw` instead of decoding "
          "them into `values`.");
ABSL_FLAG(bool, summary, false,
          "Print a tensor or list of more than 16 numbers as its shape and "
          "count/min/max/mean.");

// --- Request fields.
ABSL_FLAG(std::string, valid_lens, "",
          "Valid lengths, a comma list like 2,6: shape (B,) unless "
          "--valid_lens_shape says otherwise.");
ABSL_FLAG(std::string, valid_lens_shape, "",
          "Shape of --valid_lens, like 2x3 for (B, Q).");
ABSL_FLAG(bool, causal, false, "Causal mask: query i attends to keys j <= i.");
ABSL_FLAG(std::optional<float>, scale, std::nullopt,
          "Score scale (server default: 1/sqrt(d) for dot, 1 for gaussian).");
ABSL_FLAG(std::string, memory_name, "",
          "attention: a model of the server's repository with backend "
          "attention_memory; its keys and values answer the queries, so "
          "none are sent.");
ABSL_FLAG(std::string, model_name, "",
          "nadaraya-watson: a model of the server's repository with backend "
          "nadaraya_watson (fit-bandwidth --save_as saves one); its fitted "
          "bandwidth, and training set when it holds one, answer the "
          "queries, so no training set is sent unless named in --shape. "
          "fit-bandwidth: such a model holding its training set, refitted "
          "on it; the bandwidth found replaces its own.");
ABSL_FLAG(std::string, save_as, "",
          "fit-bandwidth: saves the fitted model, with its training set, "
          "into the server's model repository under this name (the server "
          "needs --model_repository).");
ABSL_FLAG(int64_t, oldest, 0,
          "evict: how many of the oldest rows of --memory_name to drop.");
ABSL_FLAG(int64_t, max_rows, 0,
          "append --create: keep the newest this many rows, each append "
          "dropping the oldest beyond them (0: keep all).");
ABSL_FLAG(bool, create, false,
          "append: make the memory --memory_name from these rows if the "
          "server has none, with --score, --scale and --precision (bf16 "
          "stores the rows rounded).");
ABSL_FLAG(std::string, score, "",
          "dot | gaussian: q.k or -||q - k||^2 / 2 (default dot).");
ABSL_FLAG(bool, return_weights, false,
          "Return the attention or kernel weights too.");
ABSL_FLAG(std::string, precision, "",
          "fp32 | bf16 | fp16: products in float32, bfloat16 or float16 "
          "(default fp32).");
ABSL_FLAG(std::string, kernel, "",
          "gaussian | boxcar | constant | epanechnikov (default gaussian).");
ABSL_FLAG(std::optional<float>, bandwidth, std::nullopt,
          "w in K(w * ||x - x_i||) (server default 1).");
ABSL_FLAG(std::optional<int32_t>, epochs, std::nullopt,
          "Gradient-descent epochs (server default 5).");
ABSL_FLAG(std::optional<float>, learning_rate, std::nullopt,
          "Gradient-descent step (server default 0.5).");
ABSL_FLAG(std::optional<float>, initial_bandwidth, std::nullopt,
          "Bandwidth to start from (server default 1).");

// --- load.
ABSL_FLAG(std::string, rpc, "attention",
          "load: the RPC to drive: attention | masked-softmax | batch-matmul | "
          "additive-attention | nadaraya-watson | fit-bandwidth | append | "
          "health.");
ABSL_FLAG(int32_t, concurrency, 1,
          "load, closed loop: requests in flight at all times.");
ABSL_FLAG(double, rate, 0,
          "load, open loop: target requests/s, Poisson arrivals (instead of "
          "--concurrency).");
ABSL_FLAG(int32_t, max_in_flight, 4096,
          "load, open loop: the most requests in flight; arrivals beyond it "
          "are dropped and counted.");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(10),
          "load: how long to send after the warm-up (default 10s; with "
          "--requests alone, until they are sent).");
ABSL_FLAG(int64_t, requests, 0,
          "load: stop after sending this many measured requests; 0: no "
          "limit.");
ABSL_FLAG(absl::Duration, warmup, absl::Seconds(1),
          "load: time before measuring; its requests are not counted.");
ABSL_FLAG(std::string, mix, "",
          "load: request shapes, variants separated by ';', each a --shape "
          "list with an optional weight prefix W:, like "
          "'3:keys=1x64x64,values=1x64x64;keys=1x128x64,values=1x128x64'.");
ABSL_FLAG(std::string, lk_range, "",
          "load: LO:HI, a key length Lk drawn uniformly per pooled request "
          "(keys/values for attention and additive-attention, x's last "
          "dimension for masked-softmax).");
ABSL_FLAG(std::string, valid_lens_range, "",
          "load: LO:HI, valid lengths (B,) drawn uniformly per pooled "
          "request, clipped to its key length.");
ABSL_FLAG(int32_t, pool_size, attnctl::kDefaultPoolSize,
          "load: distinct requests built before the run and cycled through.");
ABSL_FLAG(int32_t, client_threads, 1,
          "load: client threads, each with its own connection and "
          "completion queue.");
ABSL_FLAG(int32_t, retries, 0,
          "load: send a call that ended UNAVAILABLE again, the same "
          "request, at most this many times, 0-10 (its latency counts from "
          "its first send; the report counts the resends); 0: it fails at "
          "once.");
ABSL_FLAG(std::string, output_format, "text", "load: text | json.");
ABSL_FLAG(bool, allow_remote, false,
          "load: allow a --target that is not loopback (127.0.0.0/8, "
          "localhost, [::1]). Off by default so that a load test never hits "
          "a production server by a mistyped --target.");
ABSL_FLAG(std::string, expect_codes, "OK",
          "load: the status codes requests may end with, comma-separated "
          "(e.g. OK,RESOURCE_EXHAUSTED for an overload test); any other "
          "makes load exit 3 and say which.");

namespace {

using attention::v1::AttentionService;
using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

constexpr int kExitOk = 0;
constexpr int kExitUsage = 1;
constexpr int kExitNotServing = 1;
constexpr int kExitRpcFailed = 2;
constexpr int kExitUnexpectedCodes = 3;  // load: see --expect_codes

// Everything a subcommand needs, read from the flags once in main.
struct Invocation {
  std::string target;
  absl::Duration deadline;
  int max_receive_bytes = 0;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string server_name;
  std::string health_service;
  std::string target_from_cmdline;  // health: empty, or a cmdline file
  std::string input_path;  // empty: generate the request
  attnctl::RequestOptions request;
  attnctl::PrintOptions print;
  // The flags on the command line, for `load`'s own checks.
  std::set<std::string> given;
};

int UsageError(absl::string_view message) {
  absl::FPrintF(stderr, "attnctl: %s\n", message);
  return kExitUsage;
}

// gRPC's status codes are absl's, number for number.
int RpcFailed(const grpc::Status& status) {
  absl::FPrintF(stderr, "attnctl: %s: %s\n",
                absl::StatusCodeToString(
                    static_cast<absl::StatusCode>(status.error_code())),
                status.error_message());
  return kExitRpcFailed;
}

std::shared_ptr<grpc::Channel> Connect(const Invocation& invocation) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(invocation.max_receive_bytes);
  if (!invocation.server_name.empty()) {
    arguments.SetSslTargetNameOverride(invocation.server_name);
  }
  return grpc::CreateCustomChannel(invocation.target, invocation.credentials,
                                   arguments);
}

// absl's time saturates, so --deadline=inf means no deadline.
void SetDeadline(const Invocation& invocation, grpc::ClientContext* context) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + invocation.deadline));
}

// The whole of file `path`, or of stdin for "-". Errors name `flag`.
absl::StatusOr<std::string> ReadInput(const std::string& path,
                                      absl::string_view flag = "input") {
  std::FILE* file = path == "-" ? stdin : std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--%s %s: %s", flag, path, std::strerror(errno)));
  }
  std::string text;
  char buffer[1 << 16];
  size_t read;
  while ((read = std::fread(buffer, 1, sizeof(buffer), file)) > 0) {
    text.append(buffer, read);
  }
  const bool failed = std::ferror(file);
  const int error = errno;
  if (file != stdin) std::fclose(file);
  if (failed) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--%s %s: %s", flag, path, std::strerror(error)));
  }
  return text;
}

// The request: --input's JSON (or an empty message), then the request flags.
template <typename Request>
absl::StatusOr<Request> BuildRequest(const Invocation& invocation) {
  Request request;
  if (!invocation.input_path.empty()) {
    absl::StatusOr<std::string> json = ReadInput(invocation.input_path);
    if (!json.ok()) return json.status();
    const auto parsed =
        google::protobuf::util::JsonStringToMessage(*json, &request);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--input %s: not a JSON %s: %s", invocation.input_path,
          Request::descriptor()->full_name(),
          // Its first line; the rest points a caret at the JSON.
          std::string(parsed.message())
              .substr(0, parsed.message().find('\n'))));
    }
  }
  if (absl::Status status = attnctl::ApplyOptions(invocation.request, &request);
      !status.ok()) {
    return status;
  }
  return request;
}

int PrintResponse(const Invocation& invocation,
                  google::protobuf::Message* response) {
  absl::StatusOr<std::string> json =
      attnctl::FormatResponse(invocation.print, response);
  if (!json.ok()) {
    absl::FPrintF(stderr, "attnctl: %s\n", json.status().message());
    return kExitRpcFailed;
  }
  absl::PrintF("%s\n", *json);
  return kExitOk;
}

template <typename Request, typename Response>
using Rpc = grpc::Status (AttentionService::Stub::*)(grpc::ClientContext*,
                                                     const Request&, Response*);

// Builds the request, calls `rpc` and prints the response.
template <typename Request, typename Response>
int CallAndPrint(const Invocation& invocation, Rpc<Request, Response> rpc) {
  absl::StatusOr<Request> request = BuildRequest<Request>(invocation);
  if (!request.ok()) return UsageError(request.status().message());
  std::unique_ptr<AttentionService::Stub> stub =
      AttentionService::NewStub(Connect(invocation));
  grpc::ClientContext context;
  SetDeadline(invocation, &context);
  Response response;
  const grpc::Status status = (stub.get()->*rpc)(&context, *request, &response);
  if (!status.ok()) return RpcFailed(status);
  return PrintResponse(invocation, &response);
}

// --- One function per subcommand.

int RunHealth(const Invocation& given) {
  Invocation invocation = given;
  if (!invocation.target_from_cmdline.empty()) {
    absl::StatusOr<std::string> cmdline =
        ReadInput(invocation.target_from_cmdline, "target_from_cmdline");
    if (!cmdline.ok()) return UsageError(cmdline.status().message());
    absl::StatusOr<std::string> target =
        attnctl::ServerTargetFromArgs(attnctl::SplitProcCmdline(*cmdline));
    if (!target.ok()) {
      return UsageError(absl::StrCat("--target_from_cmdline ",
                                     invocation.target_from_cmdline, ": ",
                                     target.status().message()));
    }
    invocation.target = *std::move(target);
  }
  std::unique_ptr<Health::Stub> stub = Health::NewStub(Connect(invocation));
  grpc::ClientContext context;
  SetDeadline(invocation, &context);
  HealthCheckRequest request;
  request.set_service(invocation.health_service);
  HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return RpcFailed(status);
  std::string name = HealthCheckResponse::ServingStatus_Name(response.status());
  if (name.empty()) name = absl::StrCat(response.status());
  absl::PrintF("{\"status\": \"%s\"}\n", name);
  return response.status() == HealthCheckResponse::SERVING ? kExitOk
                                                           : kExitNotServing;
}

int RunMaskedSoftmax(const Invocation& invocation) {
  return CallAndPrint(invocation, &AttentionService::Stub::MaskedSoftmax);
}

int RunBatchMatmul(const Invocation& invocation) {
  return CallAndPrint(invocation, &AttentionService::Stub::BatchMatmul);
}

int RunAttention(const Invocation& invocation) {
  return CallAndPrint(invocation,
                      &AttentionService::Stub::ScaledDotProductAttention);
}

int RunAdditiveAttention(const Invocation& invocation) {
  return CallAndPrint(invocation, &AttentionService::Stub::AdditiveAttention);
}

int RunNadarayaWatson(const Invocation& invocation) {
  return CallAndPrint(invocation, &AttentionService::Stub::NadarayaWatson);
}

int RunFitBandwidth(const Invocation& invocation) {
  return CallAndPrint(invocation, &AttentionService::Stub::FitBandwidth);
}

int RunAppend(const Invocation& invocation) {
  return CallAndPrint(invocation, &AttentionService::Stub::AppendMemory);
}

int RunEvict(const Invocation& invocation) {
  return CallAndPrint(invocation, &AttentionService::Stub::EvictMemory);
}

int RunLoad(const Invocation& invocation);

// --- The subcommand table.

struct Subcommand {
  absl::string_view name;
  // For --help: the RPC, and the tensors it takes with their default shapes.
  absl::string_view description;
  // The flags it reads besides --target, --deadline and --max_message_bytes.
  // Giving any other flag is a usage error.
  std::vector<absl::string_view> flags;
  int (*run)(const Invocation&);
};

// The flags every RPC subcommand reads.
std::vector<absl::string_view> RpcFlags(
    std::vector<absl::string_view> own_flags) {
  std::vector<absl::string_view> flags = {"input",    "shape",     "seed",
                                          "encoding", "print_raw", "summary"};
  flags.insert(flags.end(), own_flags.begin(), own_flags.end());
  return flags;
}

// The flags of `load` itself; it also takes the request flags of its --rpc.
const std::vector<absl::string_view>& LoadOwnFlags() {
  static const auto* const kFlags = new std::vector<absl::string_view>{
      "rpc",       "concurrency",      "rate",          "max_in_flight",
      "duration",  "requests",         "warmup",        "mix",
      "lk_range",  "valid_lens_range", "pool_size",     "client_threads",
      "output_format", "allow_remote", "expect_codes", "seed"};
  return *kFlags;
}

std::vector<absl::string_view> LoadFlags() {
  std::vector<absl::string_view> flags = LoadOwnFlags();
  for (absl::string_view flag :
       {"input", "shape", "encoding", "valid_lens", "valid_lens_shape",
        "causal", "scale", "score", "return_weights", "precision", "memory_name",
        "model_name", "kernel", "create",
        "bandwidth", "initial_bandwidth", "learning_rate", "epochs",
        "service"}) {
    flags.push_back(flag);
  }
  return flags;
}

const std::vector<Subcommand>& Subcommands() {
  static const auto* const kSubcommands = new std::vector<Subcommand>{
      {"health",
       "grpc.health.v1.Health/Check; prints {\"status\": \"SERVING\"}\n"
       "and exits 0 only when SERVING",
       {"service", "target_from_cmdline"},
       RunHealth},
      {"masked-softmax", "MaskedSoftmax; x 2x2x4",
       RpcFlags({"valid_lens", "valid_lens_shape"}), RunMaskedSoftmax},
      {"batch-matmul", "BatchMatmul; a 2x1x4, b 2x4x6", RpcFlags({"precision"}),
       RunBatchMatmul},
      {"attention",
       "ScaledDotProductAttention; queries 2x1x2, keys 2x10x2,\n"
       "values 2x10x4 (or 4-D: (B, H, L, d))",
       RpcFlags({"valid_lens", "valid_lens_shape", "causal", "scale", "score",
                 "return_weights", "precision", "memory_name"}),
       RunAttention},
      {"additive-attention",
       "AdditiveAttention; queries 2x1x20, keys 2x10x2, values 2x10x4,\n"
       "w_q 8x20, w_k 8x2, w_v 8 (the weights follow the queries' and\n"
       "keys' widths; h = 8 follows any --shape of a w_*)",
       RpcFlags({"valid_lens", "valid_lens_shape", "return_weights"}),
       RunAdditiveAttention},
      {"nadaraya-watson",
       "NadarayaWatson; x_train 50, y_train 50, x_query 50 (textbook data)",
       RpcFlags({"kernel", "bandwidth", "return_weights", "model_name"}),
       RunNadarayaWatson},
      {"fit-bandwidth", "FitBandwidth; x_train 50, y_train 50 (textbook data)",
       RpcFlags({"initial_bandwidth", "learning_rate", "epochs", "save_as",
                 "model_name"}),
       RunFitBandwidth},
      {"append",
       "AppendMemory; keys 10x2, values 10x4 appended to the\n"
       "stored model --memory_name (durable before the answer)",
       RpcFlags({"memory_name", "create", "score", "scale", "precision",
                 "max_rows"}),
       RunAppend},
      {"evict",
       "EvictMemory; drops the --oldest rows of the stored model\n"
       "--memory_name (durable before the answer)",
       RpcFlags({"memory_name", "oldest"}), RunEvict},
      {"load",
       "drives --rpc at a loopback server and reports throughput and\n"
       "latency; takes that RPC's request flags too (see Load below)",
       LoadFlags(), RunLoad},
  };
  return *kSubcommands;
}

const Subcommand* FindSubcommand(absl::string_view name) {
  for (const Subcommand& subcommand : Subcommands()) {
    if (subcommand.name == name) return &subcommand;
  }
  return nullptr;
}

std::string UsageMessage() {
  std::string usage = R"(the command-line client of attnserve.

Usage: attnctl [flags] SUBCOMMAND

Subcommands (RPC; generated tensors and their default shapes):
)";
  const std::vector<absl::string_view> common = RpcFlags({});
  for (const Subcommand& subcommand : Subcommands()) {
    absl::StrAppendFormat(
        &usage, "  %-19s %s\n", subcommand.name,
        absl::StrReplaceAll(subcommand.description,
                            {{"\n", "\n" + std::string(22, ' ')}}));
    std::vector<std::string> own;
    for (absl::string_view flag :
         subcommand.run == RunLoad ? LoadOwnFlags() : subcommand.flags) {
      if (std::find(common.begin(), common.end(), flag) == common.end()) {
        own.push_back(absl::StrCat("--", flag));
      }
    }
    absl::StrAppendFormat(&usage, "  %-19s flags: %s\n", "",
                          absl::StrJoin(own, " "));
  }
  usage += R"(
Every RPC subcommand also takes --input --shape --seed --encoding
--print_raw --summary; every subcommand takes --target --deadline
--max_message_bytes and the security flags --tls --ca --cert --key
--server_name --token (docs/security.md).

The request comes from --input FILE (the request message in protobuf's JSON
mapping; '-' reads stdin) or, without --input, is generated: every tensor gets
its default shape above unless --shape NAME=DIMS says otherwise. With --input,
only the tensors named in --shape are generated. Request flags override the
input's fields.

Generated data is reproducible (std::mt19937 seeded with --seed): N(0, 1),
except for nadaraya-watson and fit-bandwidth, which get the data of Dive into
Deep Learning, section 11.2, so their output means something:
  x_train ~ U[0, 5), sorted
  y_train = 2 sin(x) + x^0.8 + N(0, 0.5^2)  (x: x_train's first column)
  x_query = 0, 0.1, ..., 4.9                 (m points evenly over [0, 5))

The response is printed as one line of JSON (protobuf's JSON mapping with
proto field names; raw tensors decoded into values unless --print_raw).

Load: attnctl load [--rpc RPC] [RPC's request flags] [load flags]
  Closed loop (default): --concurrency N requests in flight at all times.
  Open loop: --rate R requests/s with Poisson arrivals (exponential gaps,
  seeded by --seed), at most --max_in_flight in flight; arrivals beyond it
  are dropped and reported. Runs --warmup (not measured), then --duration
  and/or until --requests measured requests are sent; calls still in flight
  are then waited for (each bounded by --deadline).
  Requests: a pool of --pool_size requests (default 64; 1 for health) is
  built before the run from the RPC's flags (--shape, --valid_lens,
  --encoding, --input, ...) with seeds --seed, --seed+1, ..., and cycled
  through. --mix 'W:NAME=DIMS,...;NAME=DIMS,...' shares the pool among
  shape variants by weight (default 1); each variant overrides --shape.
  --lk_range LO:HI draws the key length Lk of each pooled request uniformly;
  --valid_lens_range LO:HI draws its valid lengths (B,), clipped to Lk.
  --rpc health (grpc.health.v1 Check, --service) is the per-call overhead
  baseline: quote RPC figures beside it.
  Each of --client_threads threads has its own connection and completion
  queue and its share of the concurrency, cap and rate. --retries N sends a
  call that ended UNAVAILABLE again, up to N times (as a client behind a
  proxy should: a proxy's GOAWAY can cross a new call); "retried" counts it.
  Reports completed requests, successful requests/s over the measured
  window, latency p50/p90/p99/p99.9/max of successful calls (closed loop:
  from sending; open loop: from the scheduled arrival), errors by status
  code, dropped arrivals and the achieved rate; --output_format json prints
  one JSON object.
  Only loopback targets (127.0.0.0/8, localhost, [::1], unix:) unless
  --allow_remote: a load test should never reach a production server by a
  mistyped --target.

Exit status: 0 success; 1 usage error, or health not SERVING; 2 the RPC
failed, with "attnctl: <CODE>: <message>" on stderr. load: 0 when every
request ended with a code in --expect_codes (default OK only), 1 usage
error, 2 when it could not connect or no request completed, 3 when some
request ended with a code not in --expect_codes (named on stderr).

Examples:
  attnctl health --target localhost:8001
  attnctl health --target_from_cmdline /proc/1/cmdline   # in the container
  attnctl attention --shape queries=2x1x2,keys=2x10x2,values=2x10x4 \
      --valid_lens 2,6 --return_weights
  attnctl masked-softmax --valid_lens 2,3
  attnctl nadaraya-watson --kernel gaussian --return_weights --summary
  attnctl fit-bandwidth --epochs 20
  attnctl batch-matmul --input request.json --precision bf16
  attnctl load --target 127.0.0.1:8001 --rpc health --concurrency 64
  attnctl load --target 127.0.0.1:8001 --rpc attention \
      --shape queries=1x1x64,keys=1x128x64,values=1x128x64 \
      --lk_range 16:128 --valid_lens_range 1:128 --rate 2000 --duration 30s)";
  return usage;
}

// --- Reading the command line.

// The flag name in `arg` ("input" for --input=x or -input, "nocausal" for
// --nocausal), or empty when `arg` is not a flag.
absl::string_view FlagName(absl::string_view arg) {
  if (!absl::ConsumePrefix(&arg, "-") || arg.empty() || arg == "-") return "";
  absl::ConsumePrefix(&arg, "-");
  return arg.substr(0, arg.find('='));
}

// Rewrites the command line before absl parses it:
// - a flag's value is joined to it (`--input -` becomes `--input=-`, which
//   absl would otherwise question), so values never stand alone;
// - every --shape is joined into one --shape=a,b,...: absl keeps only the last
//   value of a repeated flag, and --shape may repeat.
std::vector<std::string> NormalizeCommandLine(int argc, char** argv) {
  std::vector<std::string> args = {argv[0]};
  std::vector<std::string> shapes;
  size_t first_shape_position = 0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      args.insert(args.end(), argv + i, argv + argc);
      break;
    }
    const std::string name(FlagName(arg));
    const absl::CommandLineFlag* flag =
        name.empty() ? nullptr : absl::FindCommandLineFlag(name);
    if (flag != nullptr && !flag->IsOfType<bool>() &&
        arg.find('=') == std::string::npos && i + 1 < argc) {
      arg = absl::StrCat("--", name, "=", argv[++i]);
    }
    if (name == "shape" && arg.find('=') != std::string::npos) {
      if (shapes.empty()) first_shape_position = args.size();
      shapes.push_back(arg.substr(arg.find('=') + 1));
      continue;
    }
    args.push_back(std::move(arg));
  }
  if (!shapes.empty()) {
    args.insert(args.begin() + first_shape_position,
                absl::StrCat("--shape=", absl::StrJoin(shapes, ",")));
  }
  return args;
}

// The names of the flags on the normalized command line, read after absl
// has validated it (absl 20220623 keeps "was this flag given?" private).
std::set<std::string> FlagsOnCommandLine(const std::vector<std::string>& args) {
  std::set<std::string> names;
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    const std::string name(FlagName(args[i]));
    if (name.empty()) continue;
    if (absl::FindCommandLineFlag(name) != nullptr) {
      names.insert(name);
    } else if (absl::StartsWith(name, "no") &&
               absl::FindCommandLineFlag(name.substr(2)) != nullptr) {
      names.insert(name.substr(2));  // --nocausal
    }
  }
  return names;
}

// A usage error unless every subcommand-specific flag given is one this
// subcommand reads.
absl::Status CheckFlagsApply(const Subcommand& subcommand,
                             const std::set<std::string>& given) {
  for (const Subcommand& other : Subcommands()) {
    for (absl::string_view flag : other.flags) {
      const bool applies =
          std::find(subcommand.flags.begin(), subcommand.flags.end(), flag) !=
          subcommand.flags.end();
      if (given.count(std::string(flag)) > 0 && !applies) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "--%s does not apply to %s (it takes: --%s)", flag, subcommand.name,
            absl::StrJoin(subcommand.flags, " --")));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status FlagError(absl::string_view flag, const absl::Status& status) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, ": ", status.message()));
}

// Reads an enum-valued flag; an empty value leaves `field` unset.
template <typename Enum>
absl::Status ReadChoiceFlag(absl::string_view flag, const std::string& text,
                            absl::StatusOr<Enum> (*parse)(absl::string_view),
                            std::optional<Enum>* field) {
  if (text.empty()) return absl::OkStatus();
  absl::StatusOr<Enum> value = parse(text);
  if (!value.ok()) return FlagError(flag, value.status());
  *field = *value;
  return absl::OkStatus();
}

// The flags, checked, as an Invocation. `given`: the flags on the command
// line, which decides whether a boolean request flag overrides --input.
absl::StatusOr<Invocation> ReadFlags(const std::set<std::string>& given) {
  Invocation invocation;
  invocation.target = absl::GetFlag(FLAGS_target);
  invocation.deadline = absl::GetFlag(FLAGS_deadline);
  if (invocation.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--deadline: must be positive, got ",
                     absl::FormatDuration(invocation.deadline)));
  }
  invocation.max_receive_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (invocation.max_receive_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes: must be positive, got ",
                     invocation.max_receive_bytes));
  }
  attnctl::SecurityOptions security;
  security.tls = absl::GetFlag(FLAGS_tls);
  security.ca_path = absl::GetFlag(FLAGS_ca);
  security.cert_path = absl::GetFlag(FLAGS_cert);
  security.key_path = absl::GetFlag(FLAGS_key);
  security.server_name = absl::GetFlag(FLAGS_server_name);
  security.token = absl::GetFlag(FLAGS_token);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      attnctl::ChannelCredentials(security);
  if (!credentials.ok()) return credentials.status();
  invocation.credentials = *std::move(credentials);
  invocation.server_name = security.server_name;
  invocation.health_service = absl::GetFlag(FLAGS_service);
  invocation.target_from_cmdline = absl::GetFlag(FLAGS_target_from_cmdline);
  if (!invocation.target_from_cmdline.empty() && given.count("target")) {
    return absl::InvalidArgumentError(
        "--target_from_cmdline and --target exclude each other");
  }
  invocation.input_path = absl::GetFlag(FLAGS_input);
  invocation.given = given;
  invocation.print.keep_raw = absl::GetFlag(FLAGS_print_raw);
  invocation.print.summary = absl::GetFlag(FLAGS_summary);

  attnctl::RequestOptions& options = invocation.request;
  absl::StatusOr<std::vector<attnctl::NamedShape>> shapes =
      attnctl::ParseShapes(absl::GetFlag(FLAGS_shape));
  if (!shapes.ok()) return FlagError("shape", shapes.status());
  options.shapes = *std::move(shapes);
  options.generate_missing = invocation.input_path.empty();
  options.seed = absl::GetFlag(FLAGS_seed);

  const std::string valid_lens = absl::GetFlag(FLAGS_valid_lens);
  const std::string valid_lens_shape = absl::GetFlag(FLAGS_valid_lens_shape);
  if (!valid_lens_shape.empty() && valid_lens.empty()) {
    return absl::InvalidArgumentError(
        "--valid_lens_shape: needs --valid_lens too");
  }
  if (!valid_lens.empty()) {
    attnctl::Dims shape;
    if (!valid_lens_shape.empty()) {
      absl::StatusOr<attnctl::Dims> dims = attnctl::ParseDims(valid_lens_shape);
      if (!dims.ok()) return FlagError("valid_lens_shape", dims.status());
      shape = *std::move(dims);
    }
    absl::StatusOr<attention::v1::Lengths> lengths =
        attnctl::ParseLengths(valid_lens, shape);
    if (!lengths.ok()) return FlagError("valid_lens", lengths.status());
    options.valid_lens = *std::move(lengths);
  }

  if (given.count("causal")) options.causal = absl::GetFlag(FLAGS_causal);
  if (given.count("return_weights")) {
    options.return_weights = absl::GetFlag(FLAGS_return_weights);
  }
  options.scale = absl::GetFlag(FLAGS_scale);
  if (given.count("memory_name")) {
    options.memory_name = absl::GetFlag(FLAGS_memory_name);
  }
  if (given.count("model_name")) {
    options.model_name = absl::GetFlag(FLAGS_model_name);
  }
  if (given.count("save_as")) options.save_as = absl::GetFlag(FLAGS_save_as);
  options.create = absl::GetFlag(FLAGS_create);
  if (given.count("oldest")) options.oldest = absl::GetFlag(FLAGS_oldest);
  if (given.count("max_rows")) options.max_rows = absl::GetFlag(FLAGS_max_rows);
  options.bandwidth = absl::GetFlag(FLAGS_bandwidth);
  options.epochs = absl::GetFlag(FLAGS_epochs);
  options.learning_rate = absl::GetFlag(FLAGS_learning_rate);
  options.initial_bandwidth = absl::GetFlag(FLAGS_initial_bandwidth);

  for (absl::Status status : {
           ReadChoiceFlag("score", absl::GetFlag(FLAGS_score),
                          attnctl::ParseScore, &options.score),
           ReadChoiceFlag("precision", absl::GetFlag(FLAGS_precision),
                          attnctl::ParsePrecision, &options.precision),
           ReadChoiceFlag("kernel", absl::GetFlag(FLAGS_kernel),
                          attnctl::ParseKernel, &options.kernel),
           ReadChoiceFlag("encoding", absl::GetFlag(FLAGS_encoding),
                          attnctl::ParseEncoding, &options.encoding),
       }) {
    if (!status.ok()) return status;
  }
  return invocation;
}

// --- load.

// A usage error unless every flag given is one `load --rpc RPC` reads:
// load's own and that RPC's request flags.
absl::Status CheckLoadFlagsApply(attnctl::LoadRpc rpc,
                                 const std::set<std::string>& given) {
  const Subcommand* rpc_subcommand = FindSubcommand(attnctl::LoadRpcName(rpc));
  const std::string name =
      absl::StrCat("load --rpc ", attnctl::LoadRpcName(rpc));
  Subcommand load = *rpc_subcommand;
  load.name = name;
  load.flags.erase(std::remove_if(load.flags.begin(), load.flags.end(),
                                  [](absl::string_view flag) {
                                    return flag == "print_raw" ||
                                           flag == "summary";
                                  }),
                   load.flags.end());
  for (absl::string_view flag : LoadOwnFlags()) {
    if (std::find(load.flags.begin(), load.flags.end(), flag) ==
        load.flags.end()) {
      load.flags.push_back(flag);
    }
  }
  return CheckFlagsApply(load, given);
}

// The load flags, checked, as the run's options and the pool's.
absl::Status ReadLoadFlags(const Invocation& invocation,
                           attnctl::LoadOptions* load,
                           attnctl::PoolOptions* pool, bool* json) {
  const std::set<std::string>& given = invocation.given;
  absl::StatusOr<attnctl::LoadRpc> rpc =
      attnctl::ParseLoadRpc(absl::GetFlag(FLAGS_rpc));
  if (!rpc.ok()) return FlagError("rpc", rpc.status());
  if (absl::Status status = CheckLoadFlagsApply(*rpc, given); !status.ok()) {
    return status;
  }

  load->target = invocation.target;
  load->allow_remote = absl::GetFlag(FLAGS_allow_remote);
  load->max_receive_bytes = invocation.max_receive_bytes;
  load->credentials = invocation.credentials;
  load->server_name = invocation.server_name;
  load->deadline = invocation.deadline;
  load->target_rate = absl::GetFlag(FLAGS_rate);
  if (given.count("rate") && given.count("concurrency")) {
    return absl::InvalidArgumentError(
        "--rate (open loop) and --concurrency (closed loop) exclude each "
        "other");
  }
  if (given.count("max_in_flight") && load->target_rate <= 0) {
    return absl::InvalidArgumentError(
        "--max_in_flight: applies to the open loop (--rate) only");
  }
  load->concurrency = absl::GetFlag(FLAGS_concurrency);
  load->max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
  load->requests = absl::GetFlag(FLAGS_requests);
  // --requests alone runs until they are sent.
  load->duration = given.count("requests") && !given.count("duration")
                       ? absl::InfiniteDuration()
                       : absl::GetFlag(FLAGS_duration);
  load->warmup = absl::GetFlag(FLAGS_warmup);
  load->client_threads = absl::GetFlag(FLAGS_client_threads);
  load->seed = absl::GetFlag(FLAGS_seed);
  load->retries = absl::GetFlag(FLAGS_retries);
  const std::string format = absl::GetFlag(FLAGS_output_format);
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--output_format: expected one of text, json, got '%s'", format));
  }
  *json = format == "json";
  if (absl::Status status = attnctl::CheckLoadOptions(*load); !status.ok()) {
    return status;
  }

  pool->rpc = *rpc;
  pool->request = invocation.request;
  pool->health_service = invocation.health_service;
  pool->pool_size = absl::GetFlag(FLAGS_pool_size);
  if (!invocation.input_path.empty()) {
    absl::StatusOr<std::string> json_text = ReadInput(invocation.input_path);
    if (!json_text.ok()) return json_text.status();
    pool->input_json = *std::move(json_text);
  }
  if (const std::string mix = absl::GetFlag(FLAGS_mix); !mix.empty()) {
    absl::StatusOr<std::vector<attnctl::MixVariant>> variants =
        attnctl::ParseMix(mix);
    if (!variants.ok()) return FlagError("mix", variants.status());
    pool->mix = *std::move(variants);
  }
  if (const std::string range = absl::GetFlag(FLAGS_lk_range);
      !range.empty()) {
    absl::StatusOr<attnctl::IntRange> parsed =
        attnctl::ParseRange(range, /*min_lo=*/1);
    if (!parsed.ok()) return FlagError("lk_range", parsed.status());
    pool->lk_range = *parsed;
  }
  if (const std::string range = absl::GetFlag(FLAGS_valid_lens_range);
      !range.empty()) {
    absl::StatusOr<attnctl::IntRange> parsed =
        attnctl::ParseRange(range, /*min_lo=*/0);
    if (!parsed.ok()) return FlagError("valid_lens_range", parsed.status());
    pool->valid_lens_range = *parsed;
  }
  return absl::OkStatus();
}

int RunLoad(const Invocation& invocation) {
  attnctl::LoadOptions load;
  attnctl::PoolOptions pool_options;
  bool json = false;
  if (absl::Status status =
          ReadLoadFlags(invocation, &load, &pool_options, &json);
      !status.ok()) {
    return UsageError(status.message());
  }
  absl::StatusOr<attnctl::RequestPool> pool =
      attnctl::BuildRequestPool(pool_options);
  if (!pool.ok()) return UsageError(pool.status().message());
  if (!json) {
    absl::FPrintF(stderr, "attnctl: load %s at %s: %s warm-up, then %s...\n",
                  attnctl::LoadRpcName(pool->rpc), load.target,
                  absl::FormatDuration(load.warmup),
                  load.duration == absl::InfiniteDuration()
                      ? absl::StrCat(load.requests, " requests")
                      : absl::FormatDuration(load.duration));
  }
  absl::StatusOr<attnctl::Report> report = attnctl::RunLoad(load, *pool);
  if (!report.ok()) {
    if (report.status().code() == absl::StatusCode::kUnavailable) {
      absl::FPrintF(stderr, "attnctl: UNAVAILABLE: %s\n",
                    report.status().message());
      return kExitRpcFailed;
    }
    return UsageError(report.status().message());
  }
  if (json) {
    absl::PrintF("%s\n", attnctl::FormatReportJson(*report));
  } else {
    absl::PrintF("%s", attnctl::FormatReportText(*report));
  }
  std::set<std::string> expected;
  for (absl::string_view code :
       absl::StrSplit(absl::GetFlag(FLAGS_expect_codes), ',', absl::SkipEmpty())) {
    expected.insert(std::string(absl::StripAsciiWhitespace(code)));
  }
  if (report->requests == 0) {
    absl::FPrintF(stderr, "attnctl: load: no request completed\n");
    return kExitRpcFailed;
  }
  std::vector<std::string> unexpected;
  if (!expected.count("OK") && report->ok > 0) {
    unexpected.push_back(absl::StrCat("OK ", report->ok));
  }
  for (const auto& [code, count] : report->errors) {
    if (!expected.count(code)) unexpected.push_back(absl::StrCat(code, " ", count));
  }
  if (report->dropped > 0) {
    unexpected.push_back(absl::StrCat("dropped ", report->dropped));
  }
  if (!unexpected.empty()) {
    absl::FPrintF(stderr,
                  "attnctl: load: requests ended outside --expect_codes=%s: "
                  "%s%s\n",
                  absl::GetFlag(FLAGS_expect_codes),
                  absl::StrJoin(unexpected, ", "),
                  report->first_error.empty()
                      ? ""
                      : absl::StrCat(" (first error: ", report->first_error, ")"));
    return kExitUnexpectedCodes;
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(UsageMessage());
  std::vector<std::string> args = NormalizeCommandLine(argc, argv);
  std::vector<char*> arg_pointers;
  for (std::string& arg : args) arg_pointers.push_back(arg.data());
  // Exits 1 with absl's message on an unknown flag or a bad flag value.
  const std::vector<char*> positional = absl::ParseCommandLine(
      static_cast<int>(arg_pointers.size()), arg_pointers.data());

  if (positional.size() < 2) {
    return UsageError("missing SUBCOMMAND; see attnctl --help");
  }
  if (positional.size() > 2) {
    return UsageError(
        absl::StrFormat("unexpected argument '%s' after the subcommand; flags "
                        "take values as --flag=value or --flag value",
                        positional[2]));
  }
  const Subcommand* subcommand = FindSubcommand(positional[1]);
  if (subcommand == nullptr) {
    std::vector<absl::string_view> names;
    for (const Subcommand& known : Subcommands()) names.push_back(known.name);
    return UsageError(absl::StrFormat("unknown subcommand '%s' (known: %s)",
                                      positional[1],
                                      absl::StrJoin(names, ", ")));
  }
  const std::set<std::string> given = FlagsOnCommandLine(args);
  if (absl::Status status = CheckFlagsApply(*subcommand, given); !status.ok()) {
    return UsageError(status.message());
  }
  absl::StatusOr<Invocation> invocation = ReadFlags(given);
  if (!invocation.ok()) return UsageError(invocation.status().message());
  return subcommand->run(*invocation);
}
