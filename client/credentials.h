// The credentials a client channel uses, from attnctl's security flags:
// plaintext, TLS (the server's certificate checked against --ca, or the
// system's roots), mutual TLS (--cert and --key presented), and a bearer
// token (--token, sent as `authorization: Bearer <token>` on every call).
#ifndef ATTNSERVE_CLIENT_CREDENTIALS_H_
#define ATTNSERVE_CLIENT_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"

namespace attnctl {

struct SecurityOptions {
  bool tls = false;         // implied by any of the files below
  std::string ca_path;      // PEM roots; empty: the system's
  std::string cert_path;    // PEM client certificate (mutual TLS)
  std::string key_path;     // its PEM private key
  std::string token;        // bearer token; needs TLS
  // Overrides the name the server's certificate is checked against (and the
  // TLS SNI), e.g. when connecting by IP to a certificate issued for a name.
  std::string server_name;
};

// INVALID_ARGUMENT naming the flag for an unreadable file, --cert without
// --key (or the reverse), or --token without TLS (gRPC would refuse to send
// it, and a token in clear text is a token given away).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const SecurityOptions& options);

}  // namespace attnctl

#endif  // ATTNSERVE_CLIENT_CREDENTIALS_H_
