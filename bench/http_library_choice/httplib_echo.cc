// Minimal KServe-shaped echo server on cpp-httplib 0.11.4 (Debian
// libcpp-httplib-dev, built as libcpp-httplib.so): a thread pool where each
// keep-alive connection holds one worker. POST /v2/models/m/infer answers 200
// with the request body (httplib hands the body over as a std::string).
//
//   httplib_echo PORT TIMEOUT_S [POOL_THREADS] [NODELAY]
//       POOL_THREADS default 72 (>= 64 conns); NODELAY (default 1):
//       set_tcp_nodelay (built-in default false, and headers and body go out
//       in two writes, so Nagle holds the body until the delayed ACK)
//
// Settings: pool of 72 (the built-in default is max(8, cores-1), which would
// queue 56 of 64 keep-alive connections), keep_alive_max_count 1000000 (the
// default 5 closes a connection every 5 requests), keep-alive/read/write
// timeouts TIMEOUT_S, payload_max_length 64 MiB (default unlimited).
// On SIGTERM prints distinct client connections seen to stderr and exits.
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <thread>

static std::mutex g_mu;
static std::set<int> g_ports;

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s PORT TIMEOUT_S [POOL_THREADS] [NODELAY]\n",
            argv[0]);
    return 2;
  }
  int port = atoi(argv[1]), timeout = atoi(argv[2]);
  size_t pool = argc > 3 ? atoi(argv[3]) : 72;
  bool nodelay = argc > 4 ? atoi(argv[4]) != 0 : true;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  httplib::Server svr;
  svr.new_task_queue = [pool] { return new httplib::ThreadPool(pool); };
  svr.set_tcp_nodelay(nodelay);
  svr.set_keep_alive_max_count(1000000);
  svr.set_keep_alive_timeout(timeout);
  svr.set_read_timeout(timeout, 0);
  svr.set_write_timeout(timeout, 0);
  svr.set_payload_max_length(64 << 20);
  svr.Post("/v2/models/m/infer",
           [](const httplib::Request& req, httplib::Response& res) {
             {
               std::lock_guard<std::mutex> l(g_mu);
               g_ports.insert(req.remote_port);
             }
             res.set_content(req.body, "application/json");
           });
  if (!svr.bind_to_port("127.0.0.1", port)) {
    fprintf(stderr, "bind failed\n");
    return 1;
  }
  std::thread t([&] { svr.listen_after_bind(); });
  printf("ready\n");
  fflush(stdout);
  int sig;
  sigwait(&set, &sig);
  {
    std::lock_guard<std::mutex> l(g_mu);
    fprintf(stderr, "connections=%zu\n", g_ports.size());
  }
  _exit(0);
}
