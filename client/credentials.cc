#include "client/credentials.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnctl {
namespace {

absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  if (!in || !(contents << in.rdbuf())) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": cannot be read"));
  }
  if (contents.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": not a PEM file"));
  }
  return contents.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const SecurityOptions& options) {
  if (options.cert_path.empty() != options.key_path.empty()) {
    return absl::InvalidArgumentError("--cert and --key go together");
  }
  const bool tls = options.tls || !options.ca_path.empty() ||
                   !options.cert_path.empty() || !options.server_name.empty();
  if (!tls) {
    if (!options.token.empty()) {
      return absl::InvalidArgumentError(
          "--token needs --tls: a token sent in clear text is a token given "
          "away (and gRPC does not send it)");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions ssl;
  if (!options.ca_path.empty()) {
    absl::StatusOr<std::string> pem = ReadPem("ca", options.ca_path);
    if (!pem.ok()) return pem.status();
    ssl.pem_root_certs = *std::move(pem);
  }
  if (!options.cert_path.empty()) {
    absl::StatusOr<std::string> pem = ReadPem("cert", options.cert_path);
    if (!pem.ok()) return pem.status();
    ssl.pem_cert_chain = *std::move(pem);
    pem = ReadPem("key", options.key_path);
    if (!pem.ok()) return pem.status();
    ssl.pem_private_key = *std::move(pem);
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::SslCredentials(ssl);
  if (!options.token.empty()) {
    credentials = grpc::CompositeChannelCredentials(
        credentials, grpc::AccessTokenCredentials(options.token));
  }
  return credentials;
}

}  // namespace attnctl
