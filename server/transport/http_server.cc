#include "server/transport/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <list>
#include <memory>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "event2/buffer.h"
#include "event2/bufferevent.h"
#include "event2/bufferevent_ssl.h"
#include "event2/event.h"
#include "event2/http.h"
#include "event2/keyvalq_struct.h"
#include "event2/listener.h"
#include "event2/thread.h"
#include "openssl/err.h"
#include "openssl/ssl.h"
#include "server/process/accept_guard.h"
#include "zlib.h"

namespace attnserve {
namespace {

constexpr timeval kNow = {0, 0};
// How often a loop looks for connections to close (slow requests, idle
// keep-alive) and for connections evhttp has let go.
constexpr timeval kSweepInterval = {0, 200000};
// A socket evhttp has answered and let go while its client may still be
// sending (a body over the limit, refused with 413 from its headers) is
// read and dropped until the client closes, quiet for kLingerQuiet, or
// kLingerTime in all, as nginx's lingering close does. Closing it at once
// with data unread makes the kernel reset the connection: the client,
// still sending, gets a broken pipe, and the answer waiting in its receive
// buffer can be lost with it.
constexpr timeval kLingerQuiet = {1, 0};
constexpr absl::Duration kLingerTime = absl::Seconds(5);

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  if (code == 0) return "unknown error";
  char text[256];
  ERR_error_string_n(code, text, sizeof text);
  return text;
}

// The certificate, key and client CA into a server SSL_CTX.
absl::StatusOr<SSL_CTX*> TlsContext(const HttpServerOptions& options) {
  SSL_CTX* context = SSL_CTX_new(TLS_server_method());
  if (context == nullptr) {
    return absl::InternalError("OpenSSL: " + OpenSslError());
  }
  SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(context, options.tls_cert.c_str()) !=
      1) {
    SSL_CTX_free(context);
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_cert ", options.tls_cert, ": ", OpenSslError()));
  }
  if (SSL_CTX_use_PrivateKey_file(context, options.tls_key.c_str(),
                                  SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(context) != 1) {
    SSL_CTX_free(context);
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key ", options.tls_key, ": ", OpenSslError()));
  }
  if (!options.tls_client_ca.empty()) {
    if (SSL_CTX_load_verify_locations(context, options.tls_client_ca.c_str(),
                                      nullptr) != 1) {
      SSL_CTX_free(context);
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_client_ca ", options.tls_client_ca, ": ", OpenSslError()));
    }
    SSL_CTX_set_verify(context,
                       SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                       nullptr);
  }
  return context;
}

// A request body sent with Content-Encoding gzip or deflate (tritonclient's
// request_compression_algorithm), inflated into `out`, at most `limit`
// bytes of it (a small body may inflate to gigabytes). INVALID_ARGUMENT for
// data that does not inflate, RESOURCE_EXHAUSTED past the limit.
absl::Status Inflate(absl::string_view compressed, int64_t limit,
                     std::string* out) {
  z_stream stream{};
  // 15 + 32: zlib's or gzip's header, whichever it is ("deflate" in HTTP
  // is the zlib format).
  if (inflateInit2(&stream, 15 + 32) != Z_OK) {
    return absl::InternalError("zlib: inflateInit2 failed");
  }
  stream.next_in =
      reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  stream.avail_in = static_cast<uInt>(compressed.size());
  char chunk[64 << 10];
  int result = Z_OK;
  while (result != Z_STREAM_END) {
    stream.next_out = reinterpret_cast<Bytef*>(chunk);
    stream.avail_out = sizeof chunk;
    result = inflate(&stream, Z_NO_FLUSH);
    if (result != Z_OK && result != Z_STREAM_END) {
      inflateEnd(&stream);
      return absl::InvalidArgumentError(
          "Content-Encoding: the body does not inflate (gzip or deflate)");
    }
    out->append(chunk, sizeof chunk - stream.avail_out);
    if (static_cast<int64_t>(out->size()) > limit) {
      inflateEnd(&stream);
      return absl::ResourceExhaustedError(absl::StrCat(
          "the request body inflates to more than ", limit,
          " bytes (--max_message_bytes)"));
    }
    if (result == Z_OK && stream.avail_in == 0 && stream.avail_out != 0) {
      inflateEnd(&stream);
      return absl::InvalidArgumentError(
          "Content-Encoding: the compressed body is truncated");
    }
  }
  inflateEnd(&stream);
  return absl::OkStatus();
}

}  // namespace

// One event loop: its evhttp, its listening socket and its connections.
// Everything but Reply's hand-over runs on the loop's thread.
class HttpServer::Loop {
 public:
  Loop(HttpServer* server) : server_(server) {}
  ~Loop() {
    if (base_ != nullptr) event_base_loopbreak(base_);
    if (thread_.joinable()) thread_.join();
    if (sweep_ != nullptr) event_free(sweep_);
    if (http_ != nullptr) evhttp_free(http_);
    for (auto& [bev, connection] : connections_) bufferevent_decref(bev);
    for (Lingering* lingering : lingering_) {
      event_free(lingering->drain);
      close(lingering->fd);
      delete lingering;
    }
    if (base_ != nullptr) event_base_free(base_);
  }

  // Binds `address` (port 0 in it: a free one) and sets up evhttp.
  absl::Status Bind(const sockaddr* address, socklen_t length) {
    base_ = event_base_new();
    if (base_ == nullptr) return absl::InternalError("event_base_new failed");
    http_ = evhttp_new(base_);
    const HttpServerOptions& options = server_->options_;
    evhttp_set_max_body_size(http_, options.max_body_bytes);
    evhttp_set_max_headers_size(http_, options.max_header_bytes);
    timeval timeout = absl::ToTimeval(options.request_timeout);
    evhttp_set_timeout_tv(http_, &timeout);
    // Every method reaches the router, which answers 405 with Allow as
    // JSON; evhttp's own refusal would be an HTML 501.
    evhttp_set_allowed_methods(
        http_, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                   EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS |
                   EVHTTP_REQ_PATCH);
    evhttp_set_bevcb(http_, &Loop::NewConnection, this);
    evhttp_set_gencb(http_, &Loop::OnRequest, this);
    evconnlistener* listener = evconnlistener_new_bind(
        base_, nullptr, nullptr,
        LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_REUSEABLE_PORT |
            LEV_OPT_CLOSE_ON_EXEC,
        1024, address, static_cast<int>(length));
    if (listener == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on the HTTP port: ",
                       std::strerror(errno)));
    }
    if (evhttp_bind_listener(http_, listener) == nullptr) {
      evconnlistener_free(listener);
      return absl::InternalError("evhttp_bind_listener failed");
    }
    listen_fd_ = evconnlistener_get_fd(listener);
    // Linux gives accepted sockets the listener's TCP_NODELAY; evhttp has
    // no setting of its own, and with Nagle a 64 KiB reply waits for the
    // client's delayed ACK (~1,450 replies/s instead of ~11,000:
    // bench/http_library_choice/).
    const int one = 1;
    setsockopt(listen_fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sweep_ = event_new(base_, -1, EV_PERSIST, &Loop::Sweep, this);
    event_add(sweep_, &kSweepInterval);
    return absl::OkStatus();
  }

  int BoundPort() const {
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    if (getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address),
                    &length) != 0) {
      return 0;
    }
    if (address.ss_family == AF_INET6) {
      return ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
    }
    return ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  }

  void Run() {
    thread_ = std::thread([this] {
      event_base_loop(base_, EVLOOP_NO_EXIT_ON_EMPTY);
    });
  }

 private:
  struct PendingReply;

  // A connection, from evhttp's first call for it until evhttp lets it go
  // (it then clears the bufferevent's callbacks; we hold a reference).
  struct Connection {
    absl::Time since;          // opened, or its last response sent
    bool busy = false;         // a request is with the core or being sent
    bool closing = false;      // we shut it down
    evhttp_connection* evcon = nullptr;  // once a request has come
    std::list<PendingReply*> replies;  // in flight on it
  };

  // One request's answer: from RestResponder::Reply (any thread) back to
  // the loop, then sent; deleted when sent or when its connection closes.
  struct PendingReply final : public RestResponder {
    Loop* loop = nullptr;
    evhttp_request* request = nullptr;  // null once its connection closed
    bufferevent* connection = nullptr;
    std::list<PendingReply*>::iterator position;
    int http_status = 0;
    std::string content_type;
    RestBody body;
    Admission::Ticket ticket;
    bool sent = false;

    void Reply(int status, std::string type, RestBody answer,
               Admission::Ticket admitted) override {
      http_status = status;
      content_type = std::move(type);
      body = std::move(answer);
      ticket = std::move(admitted);
      if (std::this_thread::get_id() == loop->thread_.get_id()) {
        loop->Send(this);
      } else {
        event_base_once(loop->base_, -1, EV_TIMEOUT, &Loop::SendLater, this,
                        &kNow);
      }
    }
  };

  static bufferevent* NewConnection(event_base* base, void* arg) {
    auto* loop = static_cast<Loop*>(arg);
    HttpServer* server = loop->server_;
    bufferevent* bev = nullptr;
    if (server->tls_context_ != nullptr) {
      SSL* ssl = SSL_new(static_cast<SSL_CTX*>(server->tls_context_));
      bev = bufferevent_openssl_socket_new(base, -1, ssl,
                                           BUFFEREVENT_SSL_ACCEPTING,
                                           BEV_OPT_CLOSE_ON_FREE);
    } else {
      bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    }
    if (bev == nullptr) return nullptr;  // evhttp then makes its own
    // Reads and writes of up to 256 KiB at a time (libevent's default is
    // 16 KiB): a 64 KiB request costs ~25% less CPU. Plain sockets still
    // read at most 4 KiB a call whatever this says (libevent 2.1's
    // EVBUFFER_MAX_READ; 2.2's evbuffer_set_max_read lifts it): a 49 KB
    // binary request takes 13 readv and ioctl pairs where gRPC takes one
    // recvmsg, part of the HTTP front end's extra cost (docs/benchmarks.md).
    bufferevent_set_max_single_read(bev, 256 << 10);
    bufferevent_set_max_single_write(bev, 256 << 10);
    bufferevent_incref(bev);
    Connection& connection = loop->connections_[bev];
    connection.since = absl::Now();
    if (server->open_connections_.fetch_add(1) >=
        server->options_.max_connections) {
      // Over the cap: closed as soon as evhttp has given it its socket.
      connection.closing = true;
      CountConnectionRefused();
      event_base_once(base, -1, EV_TIMEOUT, &Loop::Refuse, bev, &kNow);
    }
    return bev;
  }

  static void Refuse(evutil_socket_t, short, void* arg) {
    const evutil_socket_t fd = bufferevent_getfd(static_cast<bufferevent*>(arg));
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
  }

  // Lets go of connections evhttp has let go; shuts down those whose
  // request is late or that sat idle too long.
  static void Sweep(evutil_socket_t, short, void* arg) {
    auto* loop = static_cast<Loop*>(arg);
    const absl::Time now = absl::Now();
    for (auto it = loop->connections_.begin();
         it != loop->connections_.end();) {
      bufferevent* bev = it->first;
      Connection& connection = it->second;
      bufferevent_data_cb read = nullptr;
      bufferevent_data_cb write = nullptr;
      bufferevent_event_cb event = nullptr;
      void* cbarg = nullptr;
      bufferevent_getcb(bev, &read, &write, &event, &cbarg);
      if (read == nullptr && write == nullptr && event == nullptr) {
        loop->Forget(it++);
        continue;
      }
      if (!connection.busy && !connection.closing &&
          now - connection.since > loop->server_->options_.request_timeout) {
        connection.closing = true;
        const evutil_socket_t fd = bufferevent_getfd(bev);
        if (fd >= 0) shutdown(fd, SHUT_RDWR);
      }
      ++it;
    }
  }

  // evhttp frees the connection: replies still coming are dropped.
  static void OnClose(evhttp_connection* evcon, void* arg) {
    auto* loop = static_cast<Loop*>(arg);
    auto it = loop->connections_.find(evhttp_connection_get_bufferevent(evcon));
    if (it == loop->connections_.end()) return;
    loop->Forget(it);
  }

  void Forget(std::unordered_map<bufferevent*, Connection>::iterator it) {
    for (PendingReply* reply : it->second.replies) {
      if (reply->sent) {
        delete reply;  // its request goes with the connection
      } else {
        reply->request = nullptr;  // SendLater deletes it
      }
    }
    bufferevent* bev = it->first;
    connections_.erase(it);
    // Still open while it lingers: it counts against --http_max_connections
    // until then.
    if (!Linger(bufferevent_getfd(bev))) server_->open_connections_.fetch_sub(1);
    bufferevent_decref(bev);
  }

  // Keeps the socket open past evhttp (a second descriptor of it) and
  // drains it; false if it cannot, and the socket closes with `bev`.
  bool Linger(evutil_socket_t fd) {
    if (fd < 0) return false;
    const int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) return false;
    auto* lingering = new Lingering{this, copy, nullptr,
                                    absl::Now() + kLingerTime};
    lingering->drain = event_new(base_, copy, EV_READ | EV_PERSIST,
                                 &Loop::Drain, lingering);
    if (lingering->drain == nullptr ||
        event_add(lingering->drain, &kLingerQuiet) != 0) {
      if (lingering->drain != nullptr) event_free(lingering->drain);
      close(copy);
      delete lingering;
      return false;
    }
    lingering_.insert(lingering);
    return true;
  }

  static void Drain(evutil_socket_t fd, short what, void* arg) {
    auto* lingering = static_cast<Lingering*>(arg);
    if ((what & EV_READ) != 0 && absl::Now() < lingering->deadline) {
      char sink[16 << 10];
      // A few reads a wake-up, so one client cannot hold the loop.
      bool still_open = true;
      for (int i = 0; i < 8 && still_open; ++i) {
        const ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
        if (n > 0) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK ||
                      errno == EINTR)) {
          return;
        }
        still_open = false;  // the client closed, or the socket failed
      }
      if (still_open) return;
    }
    Loop* loop = lingering->loop;
    loop->lingering_.erase(lingering);
    event_free(lingering->drain);
    close(lingering->fd);
    delete lingering;
    loop->server_->open_connections_.fetch_sub(1);
  }

  static void OnRequest(evhttp_request* request, void* arg) {
    auto* loop = static_cast<Loop*>(arg);
    HttpServer* server = loop->server_;
    evhttp_connection* evcon = evhttp_request_get_connection(request);
    bufferevent* bev = evhttp_connection_get_bufferevent(evcon);
    auto found = loop->connections_.find(bev);
    if (found == loop->connections_.end()) {  // evhttp's own bufferevent
      evhttp_send_error(request, 503, "connection not tracked");
      return;
    }
    Connection& connection = found->second;
    if (connection.evcon == nullptr) {
      connection.evcon = evcon;
      evhttp_connection_set_closecb(evcon, &Loop::OnClose, loop);
    }
    connection.busy = true;

    auto* reply = new PendingReply;
    reply->loop = loop;
    reply->request = request;
    reply->connection = bev;
    connection.replies.push_back(reply);
    reply->position = std::prev(connection.replies.end());

    evkeyvalq* headers = evhttp_request_get_input_headers(request);
    RestCall call;
    switch (evhttp_request_get_command(request)) {
      case EVHTTP_REQ_GET: call.method = "GET"; break;
      case EVHTTP_REQ_POST: call.method = "POST"; break;
      case EVHTTP_REQ_HEAD: call.method = "HEAD"; break;
      case EVHTTP_REQ_PUT: call.method = "PUT"; break;
      case EVHTTP_REQ_DELETE: call.method = "DELETE"; break;
      case EVHTTP_REQ_OPTIONS: call.method = "OPTIONS"; break;
      default: call.method = "PATCH"; break;
    }
    call.path = evhttp_request_get_uri(request);
    evbuffer* input = evhttp_request_get_input_buffer(request);
    const size_t length = evbuffer_get_length(input);
    if (length > 0) {
      call.body = absl::string_view(
          reinterpret_cast<const char*>(evbuffer_pullup(input, -1)), length);
    }
    std::string inflated;
    if (const char* encoding = evhttp_find_header(headers, "Content-Encoding");
        encoding != nullptr && !absl::EqualsIgnoreCase(encoding, "identity")) {
      absl::Status status;
      if (absl::EqualsIgnoreCase(encoding, "gzip") ||
          absl::EqualsIgnoreCase(encoding, "deflate")) {
        status = Inflate(call.body, server->options_.max_body_bytes, &inflated);
        call.body = inflated;
      } else {
        status = absl::UnimplementedError(absl::StrCat(
            "Content-Encoding '", encoding,
            "' is not supported; send gzip, deflate or identity"));
      }
      if (!status.ok()) {
        server->metrics_->RequestRefused(std::nullopt, Protocol::kHttp,
                                         status.code());
        const int http_status =
            status.code() == absl::StatusCode::kUnimplemented ? 415
            : status.code() == absl::StatusCode::kResourceExhausted
                ? 413
                : 400;
        reply->Reply(http_status, "application/json",
                     RestBody{RestErrorBody(status), std::nullopt, {}},
                     Admission::Ticket());
        return;
      }
    }
    if (const char* header =
            evhttp_find_header(headers, "Inference-Header-Content-Length")) {
      call.json_header_length = absl::string_view(header);
    }
    char* address = nullptr;
    ev_uint16_t port = 0;
    evhttp_connection_get_peer(evcon, &address, &port);
    call.peer = absl::StrCat("http:", address != nullptr ? address : "", ":",
                             port);

    // Bearer tokens, as on the gRPC port: health stays open.
    if (server->tokens_ != nullptr &&
        !absl::StartsWith(call.path, "/v2/health/")) {
      const char* authorization = evhttp_find_header(headers, "Authorization");
      std::optional<TokenGrant> grant;
      const bool missing =
          authorization == nullptr ||
          !absl::StartsWith(authorization, "Bearer ");
      if (!missing) grant = server->tokens_->Check(authorization + 7);
      if (!grant.has_value()) {
        server->metrics_->Unauthenticated(missing);
        reply->Reply(401, "application/json",
                     RestBody{RestErrorBody(absl::UnauthenticatedError(
                                  missing ? "missing bearer token: send "
                                            "'Authorization: Bearer <token>'"
                                          : "invalid bearer token")),
                              std::nullopt,
                              {{"WWW-Authenticate", "Bearer"}}},
                     Admission::Ticket());
        return;
      }
      call.may_control_models = grant->may_control_models;
    }
    server->handler_->Handle(call, reply);
  }

  static void SendLater(evutil_socket_t, short, void* arg) {
    auto* reply = static_cast<PendingReply*>(arg);
    reply->loop->Send(reply);
  }

  void Send(PendingReply* reply) {
    if (reply->request == nullptr) {  // its connection has gone
      delete reply;
      return;
    }
    evhttp_request* request = reply->request;
    evkeyvalq* headers = evhttp_request_get_output_headers(request);
    if (!reply->content_type.empty()) {
      evhttp_add_header(headers, "Content-Type", reply->content_type.c_str());
    }
    for (const auto& [name, value] : reply->body.headers) {
      evhttp_add_header(headers, name.c_str(), value.c_str());
    }
    if (reply->body.json_length.has_value()) {
      evhttp_add_header(headers, "Inference-Header-Content-Length",
                        absl::StrCat(*reply->body.json_length).c_str());
    }
    evbuffer* output = evhttp_request_get_output_buffer(request);
    // The body's bytes go out without a copy; freed once written.
    auto* bytes = new std::string(std::move(reply->body.bytes));
    evbuffer_add_reference(
        output, bytes->data(), bytes->size(),
        [](const void*, size_t, void* owned) {
          delete static_cast<std::string*>(owned);
        },
        bytes);
    reply->sent = true;
    evhttp_request_set_on_complete_cb(request, &Loop::OnSent, reply);
    evhttp_send_reply(request, reply->http_status, nullptr, nullptr);
  }

  // The response has been written: the connection may take its next
  // request; the admission ticket goes with the reply.
  static void OnSent(evhttp_request*, void* arg) {
    auto* reply = static_cast<PendingReply*>(arg);
    Loop* loop = reply->loop;
    auto it = loop->connections_.find(reply->connection);
    if (it != loop->connections_.end()) {
      it->second.replies.erase(reply->position);
      it->second.busy = !it->second.replies.empty();
      it->second.since = absl::Now();
    }
    delete reply;
  }

  HttpServer* const server_;
  event_base* base_ = nullptr;
  evhttp* http_ = nullptr;
  event* sweep_ = nullptr;
  int listen_fd_ = -1;
  std::thread thread_;
  std::unordered_map<bufferevent*, Connection> connections_;
  // A socket let go by evhttp, drained until its client stops sending
  // (Linger, Drain). Like connections_, touched on the loop's thread only.
  struct Lingering {
    Loop* loop;
    evutil_socket_t fd;
    event* drain;
    absl::Time deadline;
  };
  std::unordered_set<Lingering*> lingering_;
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpServerOptions& options, ServiceMetrics* metrics,
    const TokenStore* tokens, RestHandler* handler) {
  static const bool threads_ready = evthread_use_pthreads() == 0;
  if (!threads_ready) {
    return absl::InternalError("libevent: evthread_use_pthreads failed");
  }
  if (options.threads < 1 || options.max_connections < 1) {
    return absl::InvalidArgumentError(
        "--http_threads and --http_max_connections must be at least 1");
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (tokens != nullptr && options.tls_cert.empty()) {
    return absl::InvalidArgumentError(
        "--auth_tokens_file needs --tls_cert: tokens sent in clear text are "
        "tokens given away");
  }
  std::unique_ptr<HttpServer> server(new HttpServer);
  server->options_ = options;
  server->metrics_ = metrics;
  server->tokens_ = tokens;
  if (!options.tls_cert.empty()) {
    absl::StatusOr<SSL_CTX*> context = TlsContext(options);
    if (!context.ok()) return context.status();
    server->tls_context_ = *context;
  }
  server->handler_ = handler;

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int error = getaddrinfo(options.host.c_str(),
                              std::to_string(options.port).c_str(), &hints,
                              &found);
      error != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_host ", options.host, ": ", gai_strerror(error)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addresses(found,
                                                               freeaddrinfo);
  sockaddr_storage address{};
  std::memcpy(&address, found->ai_addr, found->ai_addrlen);
  const socklen_t length = found->ai_addrlen;
  // The loops share the port through SO_REUSEPORT, which would also let a
  // second attnserve start on a busy port and silently share it: a bind
  // without it first fails at boot instead (as the gRPC port does).
  if (options.port != 0) {
    const int probe = socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    setsockopt(probe, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const bool taken =
        bind(probe, reinterpret_cast<const sockaddr*>(&address), length) != 0;
    const int error = errno;
    close(probe);
    if (taken) {
      return absl::UnavailableError(absl::StrCat(
          "cannot listen on the HTTP port ", options.host, ":", options.port,
          ": ", std::strerror(error)));
    }
  }
  for (int i = 0; i < options.threads; ++i) {
    auto loop = std::make_unique<Loop>(server.get());
    if (absl::Status bound =
            loop->Bind(reinterpret_cast<const sockaddr*>(&address), length);
        !bound.ok()) {
      return absl::Status(bound.code(),
                          absl::StrCat(bound.message(), " (", options.host,
                                       ":", options.port, ")"));
    }
    if (i == 0) {
      // The other loops share the port the first one got.
      server->port_ = loop->BoundPort();
      if (address.ss_family == AF_INET6) {
        reinterpret_cast<sockaddr_in6*>(&address)->sin6_port =
            htons(server->port_);
      } else {
        reinterpret_cast<sockaddr_in*>(&address)->sin_port =
            htons(server->port_);
      }
    }
    server->loops_.push_back(std::move(loop));
  }
  for (auto& loop : server->loops_) loop->Run();
  absl::FPrintF(stderr,
                "attnserve: HTTP/REST (KServe v2) on %s:%d: %d event loops, "
                "at most %d connections, requests within %s%s\n",
                options.host, server->port_, options.threads,
                options.max_connections,
                absl::FormatDuration(options.request_timeout),
                server->tls_context_ != nullptr
                    ? (options.tls_client_ca.empty() ? ", TLS"
                                                     : ", mutual TLS")
                    : "");
  return server;
}

HttpServer::~HttpServer() {
  loops_.clear();
  if (tls_context_ != nullptr) SSL_CTX_free(static_cast<SSL_CTX*>(tls_context_));
}

}  // namespace attnserve
