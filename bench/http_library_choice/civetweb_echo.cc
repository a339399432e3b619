// Minimal KServe-shaped echo server on civetweb 1.15 (Debian libcivetweb-dev),
// thread-per-connection: num_threads workers, keep-alive on.
// POST /v2/models/m/infer: reads the whole body into a std::string and
// answers 200 with a body of the same bytes.
//
//   civetweb_echo PORT TIMEOUT_S [NUM_THREADS] [NODELAY]
//       NUM_THREADS default 72 (>= 64 conns); NODELAY (default 1) is the
//       tcp_nodelay option (built-in default 0: headers and body go out in
//       two writes, and Nagle holds the second until the delayed ACK)
//   civetweb_echo --options   (prints every option and its built-in default)
//
// Limits: max_request_size 16384 (its default; the header buffer),
// request_timeout_ms TIMEOUT_S*1000, and a 64 MiB body cap in the handler
// (civetweb 1.15 has no body-size option; the handler checks Content-Length).
// On SIGTERM prints connections accepted to stderr and exits.
#include <civetweb.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

static std::atomic<long> g_conns{0};
static constexpr long long kMaxBody = 64 << 20;

static int CountConn(const mg_connection*, void**) {
  g_conns.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

static int OnInfer(mg_connection* c, void*) {
  const mg_request_info* ri = mg_get_request_info(c);
  if (ri->content_length > kMaxBody) {
    mg_send_http_error(c, 413, "%s", "body too large");
    return 413;
  }
  std::string body;
  if (ri->content_length >= 0) {
    body.resize(ri->content_length);
    size_t got = 0;
    while (got < body.size()) {
      int r = mg_read(c, body.data() + got, body.size() - got);
      if (r <= 0) break;
      got += r;
    }
    body.resize(got);
  } else {  // chunked
    char buf[16384];
    int r;
    while ((r = mg_read(c, buf, sizeof buf)) > 0) {
      body.append(buf, r);
      if (static_cast<long long>(body.size()) > kMaxBody) {
        mg_send_http_error(c, 413, "%s", "body too large");
        return 413;
      }
    }
  }
  mg_send_http_ok(c, "application/json", body.size());
  mg_write(c, body.data(), body.size());
  return 200;
}

int main(int argc, char** argv) {
  mg_init_library(0);
  if (argc > 1 && std::string(argv[1]) == "--options") {
    for (const mg_option* o = mg_get_valid_options(); o->name; ++o)
      printf("%s=%s\n", o->name, o->default_value ? o->default_value : "");
    return 0;
  }
  if (argc < 3) {
    fprintf(stderr, "usage: %s PORT TIMEOUT_S [NUM_THREADS] [NODELAY]\n",
            argv[0]);
    return 2;
  }
  std::string ports = std::string("127.0.0.1:") + argv[1];
  std::string timeout_ms = std::to_string(atoi(argv[2]) * 1000);
  std::string threads = argc > 3 ? argv[3] : "72";
  std::string nodelay = argc > 4 ? argv[4] : "1";
  const char* opts[] = {"listening_ports", ports.c_str(),
                        "num_threads", threads.c_str(),
                        "enable_keep_alive", "yes",
                        "keep_alive_timeout_ms", timeout_ms.c_str(),
                        "request_timeout_ms", timeout_ms.c_str(),
                        "listen_backlog", "1024",
                        "tcp_nodelay", nodelay.c_str(),
                        nullptr};
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  mg_callbacks cb{};
  cb.init_connection = CountConn;
  mg_context* ctx = mg_start(&cb, nullptr, opts);
  if (!ctx) {
    fprintf(stderr, "mg_start failed\n");
    return 1;
  }
  mg_set_request_handler(ctx, "/v2/models/m/infer", OnInfer, nullptr);
  printf("ready\n");
  fflush(stdout);
  int sig;
  sigwait(&set, &sig);
  fprintf(stderr, "connections=%ld\n", g_conns.load());
  _exit(0);
}
