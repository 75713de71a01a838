// delay_proxy: a WAN link on loopback for tests and benchmarks (see
// delay_proxy.h). Prints "listening on 127.0.0.1:PORT" and relays until
// SIGINT or SIGTERM.
//   delay_proxy --to HOST:PORT --delay-ms 10 [--rate-mbit 100] [--port P]
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/tools/delay_proxy.h"

int main(int argc, char** argv) {
  std::string to;
  double delay_ms = 0, rate_mbit = 0;
  int port = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--to") {
      to = argv[i + 1];
    } else if (flag == "--delay-ms") {
      delay_ms = std::atof(argv[i + 1]);
    } else if (flag == "--rate-mbit") {
      rate_mbit = std::atof(argv[i + 1]);
    } else if (flag == "--port") {
      port = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "delay_proxy: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (to.empty() || argc % 2 == 0 || !(delay_ms >= 0 && delay_ms <= 60000) || !(rate_mbit >= 0)) {
    std::fprintf(stderr,
                 "usage: delay_proxy --to HOST:PORT --delay-ms D (one way, 0..60000) "
                 "[--rate-mbit R (0: no cap)] [--port P (0: any)]\n");
    return 2;
  }
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // before the proxy's thread starts
  meshnet::testing::DelayProxy proxy(to, delay_ms / 1e3, rate_mbit * 1e6 / 8, port);
  std::printf("listening on %s\n", proxy.address().c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  return 0;
}
