// Bearer-token authentication for both ports: tokens from a file, loaded
// once per process and lent to the gRPC and HTTP servers, reloadable without
// a restart, checked in constant time on every call (on the gRPC port by an
// AuthMetadataProcessor).
//
// The token file: one token per line, optionally followed by whitespace and
// permissions; `#` starts a comment; blank lines are ignored. Permissions:
// `save_as` (FitBandwidth may write into the model repository),
// `model_control` (RepositoryModelLoad and RepositoryModelUnload, and
// appends) and `append` (AppendMemory alone: rows added to stored models,
// and memories made by them). Tokens are at least 16 characters of
// printable ASCII without spaces (e.g. `openssl rand -hex 32`).
//
//   # ci runner
//   3f6c1b0d9e2a47c58b1f0e6d2c9a7b44
//   9a1e...   save_as
//   c04f...   save_as model_control
//
// A token is never logged: messages name the file and the line number.
#ifndef ATTNSERVE_SERVER_TRANSPORT_AUTH_H_
#define ATTNSERVE_SERVER_TRANSPORT_AUTH_H_

#include <sys/stat.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace attnserve {

struct TokenGrant {
  bool may_save = false;            // permission `save_as`
  bool may_control_models = false;  // permission `model_control`
  bool may_append = false;  // permission `append` (or `model_control`)
};

// Thread-safe: Check may run on many threads while Reload runs.
class TokenStore {
 public:
  // NOT_FOUND or PERMISSION_DENIED when the file cannot be read;
  // INVALID_ARGUMENT naming the line for a malformed one or a file without
  // tokens.
  static absl::StatusOr<std::unique_ptr<TokenStore>> Load(std::string path);
  ~TokenStore();  // stops the watcher

  // Polls the file every second (one stat()) from a thread of its own and
  // reloads it when it changed, so that an edit takes effect without a
  // signal; each reload, or its failure, is logged on stderr. Call at most
  // once; the destructor stops the thread.
  void StartWatching();
  // Reload(), and a line for the log saying what happened (SIGHUP).
  std::string ReloadForLog();

  // Reads the file again. On any error the tokens in force stay and the
  // error is returned (a half-edited file never locks everyone out).
  absl::Status Reload() ABSL_LOCKS_EXCLUDED(mu_);
  // Reload() when the file's modification time, size or inode changed since
  // the last load; OK(false) when it did not.
  absl::StatusOr<bool> ReloadIfChanged() ABSL_LOCKS_EXCLUDED(mu_);

  // The grant of `presented`, if it is a token. Takes the same time whatever
  // `presented` holds (for a given set of tokens): every token is compared,
  // every byte of each.
  std::optional<TokenGrant> Check(absl::string_view presented) const
      ABSL_LOCKS_EXCLUDED(mu_);

  int size() const ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& path() const { return path_; }

 private:
  struct Entry {
    std::string token;
    TokenGrant grant;
  };
  struct Fingerprint {
    bool operator==(const Fingerprint& other) const;
    dev_t device = 0;
    ino_t inode = 0;
    off_t size = 0;
    struct timespec modified = {};
  };

  explicit TokenStore(std::string path) : path_(std::move(path)) {}
  absl::StatusOr<std::vector<Entry>> Parse() const;
  absl::StatusOr<Fingerprint> Stat() const;

  const std::string path_;
  absl::Notification stop_watching_;
  std::thread watcher_;
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  Fingerprint loaded_ ABSL_GUARDED_BY(mu_);
};

// Why a call was refused.
enum class AuthFailure { kMissingToken, kInvalidToken };
const char* AuthFailureName(AuthFailure failure);  // "missing_token", ...

// The AuthContext property a granted `save_as` permission adds to a call.
inline constexpr char kSaveAsProperty[] = "attnserve.permission.save_as";
// The same for `model_control`.
inline constexpr char kModelControlProperty[] =
    "attnserve.permission.model_control";
// The same for `append` (which `model_control` grants too).
inline constexpr char kAppendProperty[] = "attnserve.permission.append";

// Requires `authorization: Bearer <token>` on every call except the health
// service's (probes carry no token). UNAUTHENTICATED otherwise, reported to
// `on_failure`; never blocks (IsBlocking() is false: the check is a few
// comparisons under a mutex).
class TokenAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  TokenAuthProcessor(const TokenStore* tokens,
                     std::function<void(AuthFailure)> on_failure)
      : tokens_(tokens), on_failure_(std::move(on_failure)) {}

  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata,
                       grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  const TokenStore* const tokens_;
  const std::function<void(AuthFailure)> on_failure_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_TRANSPORT_AUTH_H_
