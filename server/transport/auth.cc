#include "server/transport/auth.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"

namespace attnserve {
namespace {

constexpr size_t kMinTokenLength = 16;
constexpr absl::string_view kBearer = "Bearer ";

bool Printable(absl::string_view token) {
  for (char c : token) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

// Equal contents, in time that depends on `expected`'s length only.
bool ConstantTimeEquals(absl::string_view expected,
                        absl::string_view presented) {
  unsigned char difference = expected.size() == presented.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char offered =
        i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    difference |= static_cast<unsigned char>(expected[i]) ^ offered;
  }
  return difference == 0;
}

}  // namespace

bool TokenStore::Fingerprint::operator==(const Fingerprint& other) const {
  return device == other.device && inode == other.inode &&
         size == other.size && modified.tv_sec == other.modified.tv_sec &&
         modified.tv_nsec == other.modified.tv_nsec;
}

absl::StatusOr<std::unique_ptr<TokenStore>> TokenStore::Load(
    std::string path) {
  std::unique_ptr<TokenStore> store(new TokenStore(std::move(path)));
  if (absl::Status loaded = store->Reload(); !loaded.ok()) return loaded;
  return store;
}

absl::StatusOr<TokenStore::Fingerprint> TokenStore::Stat() const {
  struct stat info;
  if (stat(path_.c_str(), &info) != 0) {
    const int error = errno;
    const std::string message =
        absl::StrCat("--auth_tokens_file ", path_, ": ", std::strerror(error));
    return error == ENOENT ? absl::NotFoundError(message)
                           : absl::PermissionDeniedError(message);
  }
  Fingerprint fingerprint;
  fingerprint.device = info.st_dev;
  fingerprint.inode = info.st_ino;
  fingerprint.size = info.st_size;
  fingerprint.modified = info.st_mtim;
  return fingerprint;
}

absl::StatusOr<std::vector<TokenStore::Entry>> TokenStore::Parse() const {
  std::ifstream in(path_);
  if (!in) {
    return absl::PermissionDeniedError(
        absl::StrCat("--auth_tokens_file ", path_, ": cannot be read"));
  }
  std::vector<Entry> entries;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const absl::string_view content =
        absl::StripAsciiWhitespace(absl::string_view(line).substr(
            0, line.find('#')));
    if (content.empty()) continue;
    const std::vector<absl::string_view> words =
        absl::StrSplit(content, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const auto where = [&] {
      return absl::StrCat("--auth_tokens_file ", path_, " line ", number, ": ");
    };
    if (words[0].size() < kMinTokenLength || !Printable(words[0])) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(), "a token must be at least ", kMinTokenLength,
          " printable characters without spaces (the token is not shown)"));
    }
    Entry entry{std::string(words[0]), {}};
    for (size_t i = 1; i < words.size(); ++i) {
      if (words[i] == "save_as") {
        entry.grant.may_save = true;
      } else if (words[i] == "model_control") {
        entry.grant.may_control_models = true;
        entry.grant.may_append = true;
      } else if (words[i] == "append") {
        entry.grant.may_append = true;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), "unknown permission \"", words[i],
                         "\" (known: save_as, model_control, append)"));
      }
    }
    entries.push_back(std::move(entry));
  }
  if (entries.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--auth_tokens_file ", path_,
        ": no tokens (every call would be refused)"));
  }
  return entries;
}

absl::Status TokenStore::Reload() {
  absl::StatusOr<Fingerprint> fingerprint = Stat();
  if (!fingerprint.ok()) return fingerprint.status();
  absl::StatusOr<std::vector<Entry>> entries = Parse();
  if (!entries.ok()) return entries.status();
  absl::MutexLock lock(&mu_);
  entries_ = *std::move(entries);
  loaded_ = *fingerprint;
  return absl::OkStatus();
}

absl::StatusOr<bool> TokenStore::ReloadIfChanged() {
  absl::StatusOr<Fingerprint> now = Stat();
  if (!now.ok()) return now.status();
  {
    absl::MutexLock lock(&mu_);
    if (*now == loaded_) return false;
  }
  if (absl::Status reloaded = Reload(); !reloaded.ok()) {
    // Remember the broken version, so it is reported once, not every poll.
    absl::MutexLock lock(&mu_);
    loaded_ = *now;
    return reloaded;
  }
  return true;
}

std::optional<TokenGrant> TokenStore::Check(absl::string_view presented) const {
  absl::MutexLock lock(&mu_);
  std::optional<TokenGrant> grant;
  for (const Entry& entry : entries_) {
    // No early exit: the time does not tell which token (if any) matched.
    if (ConstantTimeEquals(entry.token, presented)) grant = entry.grant;
  }
  return grant;
}

int TokenStore::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(entries_.size());
}

const char* AuthFailureName(AuthFailure failure) {
  switch (failure) {
    case AuthFailure::kMissingToken:
      return "missing_token";
    case AuthFailure::kInvalidToken:
      return "invalid_token";
  }
  return "unknown";
}

grpc::Status TokenAuthProcessor::Process(const InputMetadata& auth_metadata,
                                         grpc::AuthContext* context,
                                         OutputMetadata* consumed_auth_metadata,
                                         OutputMetadata* /*response_metadata*/) {
  // Probes (Kubernetes, load balancers, HEALTHCHECK) carry no token.
  const auto path = auth_metadata.find(":path");
  if (path != auth_metadata.end() &&
      absl::StartsWith(absl::string_view(path->second.data(),
                                         path->second.size()),
                       "/grpc.health.v1.Health/")) {
    return grpc::Status::OK;
  }
  const auto header = auth_metadata.find("authorization");
  if (header == auth_metadata.end()) {
    on_failure_(AuthFailure::kMissingToken);
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing token: send the metadata "
                        "\"authorization: Bearer <token>\"");
  }
  absl::string_view value(header->second.data(), header->second.size());
  if (!absl::ConsumePrefix(&value, kBearer)) {
    on_failure_(AuthFailure::kInvalidToken);
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the authorization metadata must be \"Bearer <token>\"");
  }
  const std::optional<TokenGrant> grant = tokens_->Check(value);
  if (!grant.has_value()) {
    on_failure_(AuthFailure::kInvalidToken);
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid token");
  }
  consumed_auth_metadata->insert(std::make_pair(
      std::string(header->first.data(), header->first.size()),
      std::string(header->second.data(), header->second.size())));
  if (grant->may_save) context->AddProperty(kSaveAsProperty, "true");
  if (grant->may_control_models) {
    context->AddProperty(kModelControlProperty, "true");
  }
  if (grant->may_append) context->AddProperty(kAppendProperty, "true");
  return grpc::Status::OK;
}

TokenStore::~TokenStore() {
  if (watcher_.joinable()) {
    stop_watching_.Notify();
    watcher_.join();
  }
}

void TokenStore::StartWatching() {
  watcher_ = std::thread([this] {
    while (!stop_watching_.WaitForNotificationWithTimeout(absl::Seconds(1))) {
      absl::StatusOr<bool> reloaded = ReloadIfChanged();
      if (!reloaded.ok()) {
        absl::FPrintF(stderr,
                      "attnserve: token file changed: %s; the previous "
                      "tokens stay\n",
                      reloaded.status().message());
      } else if (*reloaded) {
        absl::FPrintF(stderr,
                      "attnserve: token file changed: reloaded %d tokens\n",
                      size());
      }
    }
  });
}

std::string TokenStore::ReloadForLog() {
  if (absl::Status reloaded = Reload(); !reloaded.ok()) {
    return absl::StrCat(reloaded.message(), "; the previous tokens stay");
  }
  return absl::StrFormat("reloaded %d tokens from %s", size(), path());
}

}  // namespace attnserve
