// The WAN delay proxy: every byte arrives whole, in order and no earlier than
// its delay (and, with a rate cap, no faster than the rate); a half-close
// passes through. Only lower bounds on time are asserted: a busy machine may
// make the link slower, never faster.
#include "tests/tools/delay_proxy.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>
#include <vector>

namespace meshnet::testing {
namespace {

using Clock = std::chrono::steady_clock;

// An echo server on 127.0.0.1: each connection gets back what it sent, and
// is closed once its client half-closed.
class EchoServer {
 public:
  EchoServer() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd_, 8), 0);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      char buf[1 << 16];
      for (;;) {
        const ssize_t n = recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        for (ssize_t sent = 0; sent < n;) {
          const ssize_t w = send(c, buf + sent, static_cast<size_t>(n - sent), MSG_NOSIGNAL);
          if (w <= 0) break;
          sent += w;
        }
      }
      close(c);
    });
  }
  ~EchoServer() {
    shutdown(fd_, SHUT_RDWR);
    thread_.join();
    close(fd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

int Dial(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  timeval tv{30, 0};  // a broken proxy fails the test instead of hanging it
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

TEST(DelayProxy, ARoundTripTakesTwiceTheOneWayDelay) {
  EchoServer echo;
  DelayProxy proxy(echo.address(), 0.025);
  const int fd = Dial(proxy.port());
  for (int i = 0; i < 4; ++i) {
    const char ping = static_cast<char>('a' + i);
    const Clock::time_point t0 = Clock::now();
    ASSERT_EQ(send(fd, &ping, 1, 0), 1);
    char pong = 0;
    ASSERT_EQ(recv(fd, &pong, 1, 0), 1);
    EXPECT_EQ(pong, ping);
    EXPECT_GE(Since(t0), 0.050) << "round trip " << i;
  }
  close(fd);
  EXPECT_EQ(proxy.connections(), 1);
}

TEST(DelayProxy, BytesArriveWholeInOrderAndNoFasterThanTheRate) {
  EchoServer echo;
  constexpr double kRate = 8e6;  // bytes/s each way
  DelayProxy proxy(echo.address(), 0.005, kRate);
  std::vector<char> data(1 << 20);
  std::mt19937 rng(7);
  for (char& c : data) c = static_cast<char>(rng());
  const int fd = Dial(proxy.port());
  const Clock::time_point t0 = Clock::now();
  std::thread writer([&] {
    for (size_t sent = 0; sent < data.size();) {
      const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
    shutdown(fd, SHUT_WR);  // the half-close reaches the echo server, which closes
  });
  std::vector<char> back;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    back.insert(back.end(), buf, buf + n);
  }
  writer.join();
  close(fd);
  EXPECT_EQ(back, data) << "got " << back.size() << " bytes";
  EXPECT_GE(Since(t0), static_cast<double>(data.size()) / kRate);
}

}  // namespace
}  // namespace meshnet::testing
