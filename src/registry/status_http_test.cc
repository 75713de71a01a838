// The registry page against slow and greedy clients: clients that drip a
// request byte by byte hold a connection for the request deadline at most,
// one address cannot take every thread, and the page keeps answering.
#include "registry/status_http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "registry/memory_registry.h"

namespace meshnet::registry {
namespace {

using Clock = std::chrono::steady_clock;

// A connection to 127.0.0.1:port from `source` (another loopback address, so
// that it counts as another client than the test's own requests).
int DialFrom(const char* source, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from), 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
  return fd;
}

// Sends a request head one byte at a time, a byte every 100 ms, for at most
// `limit_s`; returns the seconds until the server closed the connection (or
// limit_s if it never did).
double Drip(int fd, double limit_s) {
  const std::string head =
      "GET /status.json HTTP/1.1\r\nHost: x\r\nX-Slow: " + std::string(200, 'a') + "\r\n";
  const auto t0 = Clock::now();
  for (size_t i = 0;; ++i) {
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    if (t >= limit_s) return limit_s;
    if (send(fd, &head[i % head.size()], 1, MSG_NOSIGNAL) != 1) return t;
    char c;
    if (recv(fd, &c, 1, MSG_DONTWAIT) == 0) return t;  // closed by the server
    // The drip is the attack under test: each byte arrives well within any
    // per-read timeout.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

TEST(StatusHttp, DripFedClientsDoNotBlockThePage) {
  MemoryRegistry reg;
  StatusHttpServer page(&reg);
  const std::string bound = page.Start("127.0.0.1:0");
  const int port = std::stoi(bound.substr(bound.rfind(':') + 1));
  constexpr int kDrips = 10;  // more than the page's threads, all from one address
  std::vector<double> held(kDrips, -1);
  std::vector<std::thread> drips;
  std::atomic<int> connected{0};
  for (int i = 0; i < kDrips; ++i) {
    drips.emplace_back([&, i] {
      const int fd = DialFrom("127.0.0.2", port);
      ++connected;
      held[i] = Drip(fd, 8.0);
      close(fd);
    });
  }
  while (connected.load() < kDrips) std::this_thread::yield();
  // Meanwhile the page answers another client, again and again.
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(5, 0);
  cli.set_read_timeout(5, 0);
  for (int k = 0; k < 5; ++k) {
    const auto res = cli.Get("/status.json");
    ASSERT_TRUE(res) << "the page did not answer while clients drip";
    EXPECT_EQ(res->status, 200);
  }
  for (auto& t : drips) t.join();
  for (int i = 0; i < kDrips; ++i) {
    EXPECT_LT(held[i], 8.0) << "drip " << i << " held its connection for 8 s";
  }
  EXPECT_GE(page.refused_connections(), kDrips - StatusHttpOptions{}.max_per_ip);
}

// Issue 32 (audit): `Range: bytes=0-,0-,...` asked for a multipart reply
// with a copy of the page per range, built in memory. The page honours one
// range of a GET at most (http::NormalizeRequest, as the API does).
TEST(StatusHttp, ManyRangesGetOnePage) {
  MemoryRegistry reg;
  StatusHttpServer page(&reg);
  const std::string bound = page.Start("127.0.0.1:0");
  const int port = std::stoi(bound.substr(bound.rfind(':') + 1));
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(5, 0);
  const auto plain = cli.Get("/");
  ASSERT_TRUE(plain);
  ASSERT_EQ(plain->status, 200);
  const size_t page_bytes = plain->body.size();
  ASSERT_GT(page_bytes, 1000u);
  std::string ranges = "bytes=0-";
  for (int i = 1; i < 2700; ++i) ranges += ",0-";
  for (const char* path : {"/", "/status.json"}) {
    const int fd = DialFrom("127.0.0.1", port);
    const std::string request = std::string("GET ") + path +
                                " HTTP/1.1\r\nHost: x\r\nRange: " + ranges +
                                "\r\nConnection: close\r\n\r\n";
    ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(request.size()));
    std::string reply;
    char buf[16384];
    for (ssize_t n; reply.size() < 64 * page_bytes && (n = recv(fd, buf, sizeof buf, 0)) > 0;) {
      reply.append(buf, static_cast<size_t>(n));  // ends when the server closes
    }
    close(fd);
    const std::string status = reply.substr(0, reply.find("\r\n"));
    EXPECT_TRUE(status == "HTTP/1.1 200 OK" || status == "HTTP/1.1 206 Partial Content")
        << path << ": " << status;
    EXPECT_EQ(reply.find("multipart/byteranges"), std::string::npos) << path;
    EXPECT_LT(reply.size(), 2 * page_bytes) << path << ": a reply of " << reply.size() << " bytes";
  }
}

}  // namespace
}  // namespace meshnet::registry
