// DelayProxy: a user-space TCP proxy that makes a loopback link look like a
// WAN link (this machine's kernel has no netem). Every connection accepted on
// 127.0.0.1 is relayed to `target`; each direction delivers every byte
// `delay_s` after it arrived (one-way delay), and with `rate_bytes_s` > 0 no
// faster than that rate (a bandwidth cap: a byte leaves after the bytes
// queued before it, then travels the delay). Order, content and half-closes
// are kept; a direction queues at most kMaxQueuedBytes (beyond that the
// proxy stops reading it, so TCP's own flow control pushes back).
//
// Written here: no Debian package offers a delay proxy usable from tests
// (tc/netem needs a kernel module this machine lacks; toxiproxy is not in
// bookworm).
//
// One thread (poll) serves every connection. Upstream connects are blocking:
// for loopback targets only. Test tool, not production code.
//
// Thread-safety: the constructor starts the thread, the destructor stops it;
// port() and connections() may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

namespace meshnet::testing {

class DelayProxy {
 public:
  static constexpr int64_t kMaxQueuedBytes = int64_t{8} << 20;

  // `target`: "host:port" (IPv4 or a name; "": none yet, connections are
  // closed until SetTarget names one). Listens on 127.0.0.1:listen_port
  // (0: any free port). Throws std::runtime_error when it cannot listen.
  DelayProxy(const std::string& target, double delay_s, double rate_bytes_s = 0,
             int listen_port = 0);
  ~DelayProxy();
  DelayProxy(const DelayProxy&) = delete;
  DelayProxy& operator=(const DelayProxy&) = delete;

  // Where connections accepted from now on go (a node started after its
  // proxy, to learn the address it is reached at: serve --advertise).
  void SetTarget(const std::string& target);
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int64_t connections() const { return accepted_.load(); }

 private:
  struct Loop;
  void Run();

  std::unique_ptr<Loop> loop_;
  int port_ = 0;
  int wake_[2] = {-1, -1};
  std::atomic<int64_t> accepted_{0};
  std::thread thread_;
};

}  // namespace meshnet::testing
