// Minimal KServe-shaped echo server on libevent 2.1 evhttp (Debian libevent-dev).
// POST /v2/models/m/infer: reads the whole body into a std::string (a JSON
// parser needs it contiguous) and answers 200 with a body of the same bytes.
//
//   evhttp_echo PORT TIMEOUT_S [LOOP_THREADS] [NODELAY] [BIG_IO]
//
// One event loop per thread, each with its own SO_REUSEPORT listening socket
// handed to evhttp_accept_socket_with_handle (libevent 2.1.12 has no public
// way to hand evhttp an already-accepted fd: evhttp_get_request is static in
// http.c and not exported from libevent-2.1.so.7).
// NODELAY (default 1) sets TCP_NODELAY on the listening socket, which Linux
// copies to every accepted socket: evhttp has no setting for it, and
// bufferevent writes a large reply in 16 KiB pieces, each below loopback's
// MSS, so without it Nagle holds each piece until the client's delayed ACK.
// BIG_IO (default 0) =1 makes each connection's bufferevent itself (through
// evhttp_set_bevcb) and raises its max single read and write from
// libevent's 16 KiB to 256 KiB (bufferevent_set_max_single_read/write), so
// a 64 KiB body moves in one syscall each way instead of four or more.
// Limits as we would deploy them: 8 KiB of headers, 64 MiB of body,
// evhttp_set_timeout(TIMEOUT_S). On SIGTERM prints the number of connections
// it accepted (keep-alive check) to stderr and exits.
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

static std::atomic<long> g_conns{0};

static bufferevent* CountConn(event_base* base, void* big_io) {
  g_conns.fetch_add(1, std::memory_order_relaxed);
  if (!big_io) return nullptr;  // evhttp then makes its own, as below
  bufferevent* bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
  bufferevent_set_max_single_read(bev, 256 << 10);
  bufferevent_set_max_single_write(bev, 256 << 10);
  return bev;
}

static void OnInfer(evhttp_request* req, void*) {
  evbuffer* in = evhttp_request_get_input_buffer(req);
  std::string body(evbuffer_get_length(in), '\0');
  evbuffer_remove(in, body.data(), body.size());
  evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                    "application/json");
  evbuffer_add(evhttp_request_get_output_buffer(req), body.data(), body.size());
  evhttp_send_reply(req, 200, "OK", nullptr);
}

static int Listen(int port, bool nodelay) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  if (nodelay) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      listen(fd, 1024) != 0) {
    perror("bind/listen");
    exit(1);
  }
  return fd;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr,
            "usage: %s PORT TIMEOUT_S [LOOP_THREADS] [NODELAY] [BIG_IO]\n",
            argv[0]);
    return 2;
  }
  int port = atoi(argv[1]), timeout = atoi(argv[2]);
  int nthreads = argc > 3 ? atoi(argv[3]) : 1;
  bool nodelay = argc > 4 ? atoi(argv[4]) != 0 : true;
  bool big_io = argc > 5 && atoi(argv[5]) != 0;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  std::vector<std::thread> loops;
  for (int i = 0; i < nthreads; ++i) {
    int fd = Listen(port, nodelay);
    loops.emplace_back([fd, timeout, big_io] {
      event_base* base = event_base_new();
      evhttp* http = evhttp_new(base);
      evhttp_set_max_headers_size(http, 8192);
      evhttp_set_max_body_size(http, 64 << 20);
      evhttp_set_timeout(http, timeout);
      evhttp_set_allowed_methods(http, EVHTTP_REQ_POST | EVHTTP_REQ_GET);
      evhttp_set_bevcb(http, CountConn,
                       big_io ? reinterpret_cast<void*>(1) : nullptr);
      evhttp_set_cb(http, "/v2/models/m/infer", OnInfer, nullptr);
      if (!evhttp_accept_socket_with_handle(http, fd)) exit(1);
      event_base_dispatch(base);
    });
  }
  printf("ready\n");
  fflush(stdout);
  int sig;
  sigwait(&set, &sig);
  fprintf(stderr, "connections=%ld\n", g_conns.load());
  _exit(0);
}
