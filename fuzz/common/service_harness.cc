#include "fuzz/common/service_harness.h"

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "fuzz/common/checking_backend.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/support/server_callback.h"

namespace attn_fuzz {
namespace {

std::vector<std::string>* TemporaryFolders() {
  static auto* const folders = new std::vector<std::string>;
  return folders;
}

void RemoveTemporaryFolders() {
  for (const std::string& folder : *TemporaryFolders()) RemoveTree(folder);
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  FUZZ_CHECK(file.good(), "cannot read %s", path.c_str());
  std::ostringstream bytes;
  bytes << file.rdbuf();
  return bytes.str();
}

// Copies each model folder of `from` (config.pbtxt, weights.safetensors)
// into `to`.
void CopyModels(const std::string& from, const std::string& to) {
  DIR* handle = opendir(from.c_str());
  FUZZ_CHECK(handle != nullptr, "cannot open %s", from.c_str());
  while (dirent* entry = readdir(handle)) {
    const std::string name = entry->d_name;
    struct stat info;
    if (name[0] == '.' || stat((from + "/" + name).c_str(), &info) != 0 ||
        !S_ISDIR(info.st_mode)) {
      continue;
    }
    FUZZ_CHECK(mkdir((to + "/" + name).c_str(), 0700) == 0, "mkdir %s/%s",
               to.c_str(), name.c_str());
    for (const char* file : {"config.pbtxt", "weights.safetensors"}) {
      WriteFileOrDie(to + "/" + name + "/" + file,
                     ReadFileOrDie(from + "/" + name + "/" + file));
    }
  }
  closedir(handle);
}

// The call a handler's reactor is bound to, in place of gRPC's: Finish
// records the status. Works for whatever reactor the handler returns, the
// context's DefaultReactor() or one of its own (gRPC replays a Finish the
// handler called before the bind, as on a real server).
class HarnessCall final : public grpc::ServerCallbackUnary {
 public:
  explicit HarnessCall(grpc::ServerUnaryReactor* reactor) : reactor_(reactor) {
    BindReactor(reactor);
  }

  void Finish(grpc::Status status) override {
    status_ = std::move(status);
    done_.Notify();
    finished_.store(true, std::memory_order_release);  // the last access
  }
  void SendInitialMetadata() override {}

  // Blocks until Finish has returned; then the status.
  grpc::Status Wait() {
    done_.WaitForNotification();
    while (!finished_.load(std::memory_order_acquire)) std::this_thread::yield();
    return status_;
  }

 private:
  grpc::internal::ServerReactor* reactor() override { return reactor_; }
  void CallOnDone() override {}

  grpc::ServerUnaryReactor* const reactor_;
  absl::Notification done_;
  std::atomic<bool> finished_{false};
  grpc::Status status_;
};

}  // namespace

bool IsExpectedErrorCode(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::PERMISSION_DENIED:
      return true;
    default:
      return false;
  }
}

std::string MakeTemporaryFolder(const char* prefix) {
  struct stat info;
  const char* chosen = std::getenv("ATTN_FUZZ_TMPDIR");
  const std::string base =
      chosen != nullptr && *chosen != '\0'
          ? chosen
          : stat("/dev/shm", &info) == 0 && S_ISDIR(info.st_mode) ? "/dev/shm"
                                                                  : "/tmp";
  std::string pattern = base + "/" + prefix + "-XXXXXX";
  FUZZ_CHECK(mkdtemp(pattern.data()) != nullptr, "mkdtemp %s", pattern.c_str());
  static std::once_flag registered;
  std::call_once(registered, [] { std::atexit(RemoveTemporaryFolders); });
  TemporaryFolders()->push_back(pattern);
  return pattern;
}

void WriteFileOrDie(const std::string& path, const std::string& bytes) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  FUZZ_CHECK(file != nullptr, "cannot write %s", path.c_str());
  FUZZ_CHECK(std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size(),
             "short write to %s", path.c_str());
  FUZZ_CHECK(std::fclose(file) == 0, "cannot close %s", path.c_str());
}

void RemoveTree(const std::string& path) {
  nftw(
      path.c_str(),
      [](const char* name, const struct stat*, int, struct FTW*) {
        std::remove(name);
        return 0;
      },
      16, FTW_DEPTH | FTW_PHYS);
}

ServiceHarness& ServiceHarness::Get() {
  static ServiceHarness* const harness = [] {
    // Protobuf's text-format and JSON parsers log every malformed input.
    google::protobuf::SetLogHandler(nullptr);
    auto* h = new ServiceHarness;
    std::vector<std::unique_ptr<attn::Backend>> backends;
    backends.push_back(std::make_unique<CheckingBackend>(kReferenceBelowFlops,
                                                         kMaxResponseBytes));
    absl::StatusOr<std::unique_ptr<attn::Engine>> engine =
        attn::Engine::CreateWithBackends(std::move(backends));
    FUZZ_CHECK(engine.ok(), "engine: %s", engine.status().ToString().c_str());

    attnserve::ExecutionStack::Options options;
    options.workers.threads = 1;
    options.limits.max_response_bytes = kMaxResponseBytes;
    if (const char* batching = std::getenv("ATTN_FUZZ_BATCHING");
        batching != nullptr && std::string(batching) == "1") {
      options.batching = attnserve::BatchingOptions{};
    }
    absl::StatusOr<std::unique_ptr<attnserve::ExecutionStack>> core =
        attnserve::ExecutionStack::Create(options, *std::move(engine));
    FUZZ_CHECK(core.ok(), "core: %s", core.status().ToString().c_str());
    h->core_ = *std::move(core);

    h->repository_dir_ = MakeTemporaryFolder("attn-fuzz-models");
    CopyModels(std::string(ATTN_SOURCE_DIR) + "/deploy/models",
               h->repository_dir_);
    absl::StatusOr<std::unique_ptr<attnserve::ModelRepository>> repository =
        attnserve::LoadModelRepository(h->repository_dir_);
    FUZZ_CHECK(repository.ok(), "repository: %s",
               repository.status().ToString().c_str());
    h->repository_ = *std::move(repository);

    h->catalogue_ =
        std::make_unique<attnserve::ModelCatalogue>(h->repository_.get());
    h->typed_ = std::make_unique<attnserve::AttentionService>(
        &h->core_->calls(), h->catalogue_.get());
    h->kserve_ = std::make_unique<attnserve::InferenceService>(
        h->core_.get(), h->catalogue_.get(), /*max_batch_size=*/32);
    return h;
  }();
  return *harness;
}

grpc::Status ServiceHarness::Call(
    const std::function<grpc::ServerUnaryReactor*(grpc::CallbackServerContext*)>&
        invoke) {
  grpc::CallbackServerContext context;
  grpc::ServerUnaryReactor* reactor = invoke(&context);
  FUZZ_CHECK(reactor != nullptr, "the handler returned no reactor");
  grpc::Status status;
  {
    HarnessCall call(reactor);
    status = call.Wait();
  }
  // What gRPC does once the call is over (a reactor of the handler's own may
  // delete itself here; the context's default one does nothing).
  reactor->OnDone();
  return status;
}

}  // namespace attn_fuzz
