// The hardened server in process on 127.0.0.1:0 with small limits: heads are
// read without a worker (two workers serve while slow clients wait), every
// cap and deadline answers with its status, chunked bodies are counted,
// half-closed clients get their answer, Stop closes what is not in a handler.
#include "http/hardened_server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "http/http_test_util.h"

namespace meshnet::http {
namespace {

using testing::RawHttp;
using testing::StatusOf;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A latch the test opens for the /wait handler.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int waiting = 0;
  void Open() {
    std::lock_guard lock(mu);
    open = true;
    cv.notify_all();
  }
  void AwaitWaiters(int n) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return waiting >= n; });
  }
};

struct TestServer {
  explicit TestServer(HardenedOptions o = Options(), const std::string& host = "127.0.0.1",
                      const std::function<void(HardenedServer&)>& more_routes = {})
      : server(o) {
    if (more_routes) more_routes(server);
    server.Get("/hello", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("hi", "text/plain");
    });
    server.Post("/echo", [](const httplib::Request&, httplib::Response& res,
                            const httplib::ContentReader& reader) {
      std::string body;
      if (auto r = ReadBody(reader, 1000, &body)) {
        res.status = r->status;
        return;
      }
      res.set_content(body, "text/plain");
    });
    server.Get("/wait", [this](const httplib::Request&, httplib::Response& res) {
      std::unique_lock lock(gate.mu);
      ++gate.waiting;
      gate.cv.notify_all();
      gate.cv.wait(lock, [&] { return gate.open; });
      res.set_content("done", "text/plain");
    });
    // Answers whether the client looked gone within 300 ms (or 10 s with ?until-gone).
    server.Get("/gone", [this](const httplib::Request& req, httplib::Response& res) {
      const double limit = req.has_param("until-gone") ? 10 : 0.3;
      const Clock::time_point t = Clock::now();
      bool is_gone = false;
      while (!is_gone && SecondsSince(t) < limit) {
        is_gone = CurrentConnection()->ClientGone();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the handler's poll interval
      }
      gone = is_gone;
      gone_known = true;
      res.set_content(is_gone ? "gone" : "stayed", "text/plain");
    });
    port = server.Bind(host, 0);
    address = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
              std::to_string(port);
    thread = std::thread([this] { server.Serve(); });
  }
  ~TestServer() {
    gate.Open();
    server.Stop();
    if (thread.joinable()) thread.join();
  }
  static HardenedOptions Options() {
    HardenedOptions o;
    o.worker_threads = 2;
    o.connection.idle_timeout_s = 1;
    o.connection.head_timeout_s = 0.5;
    o.connection.body_timeout_s = 1;
    o.connection.max_head_bytes = 4096;
    o.connection.max_header_count = 20;
    o.connection.max_body_bytes = 1000;
    o.hub.max_connections_per_ip = 16;
    return o;
  }
  std::string Get(const std::string& path, const std::string& extra = "") {
    RawHttp c(address, false);
    c.Send("GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + extra + "\r\n");
    return c.Read(10);
  }

  HardenedServer server;
  Gate gate;
  std::atomic<bool> gone{false}, gone_known{false};
  int port = 0;
  std::string address;
  std::thread thread;
};

TEST(HardenedServer, KeepAliveAndPipelinedRequestsAreAnsweredInOrder) {
  TestServer ts;
  RawHttp c(ts.address, false);
  const std::string get = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
  c.Send("\r\n" + get + get + "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string all = c.Read(10);
  size_t answers = 0;
  for (size_t p = all.find("HTTP/1.1 200"); p != std::string::npos;
       p = all.find("HTTP/1.1 200", p + 1)) {
    ++answers;
  }
  EXPECT_EQ(answers, 3u) << all;
  EXPECT_TRUE(c.closed());
}

// Two workers; six clients stuck mid-head and two huge heads hold none of
// them: a whole request is answered at once; the stuck ones get 408 when
// the head deadline passes, the huge ones 431.
TEST(HardenedServer, SlowAndHugeHeadsHoldNoWorker) {
  TestServer ts;
  std::vector<std::unique_ptr<RawHttp>> slow;
  for (int i = 0; i < 6; ++i) {
    slow.push_back(std::make_unique<RawHttp>(ts.address, false));
    slow.back()->Send("GET /hello HTTP/1.1\r\nHost: x\r\n");
  }
  RawHttp big(ts.address, false);
  big.Send("GET /hello HTTP/1.1\r\nX: " + std::string(5000, 'v') + "\r\n\r\n");
  RawHttp many(ts.address, false);
  std::string lines;
  for (int i = 0; i < 21; ++i) lines += "X-" + std::to_string(i) + ": 1\r\n";
  many.Send("GET /hello HTTP/1.1\r\n" + lines + "\r\n");
  const Clock::time_point t = Clock::now();
  EXPECT_EQ(StatusOf(ts.Get("/hello")), 200);
  EXPECT_LT(SecondsSince(t), 0.4) << "the request waited behind the slow heads";
  EXPECT_EQ(StatusOf(big.Read(5)), 431);
  EXPECT_EQ(StatusOf(many.Read(5)), 431);
  for (auto& s : slow) {
    const std::string r = s->Read(5);
    EXPECT_EQ(StatusOf(r), 408) << r;
    EXPECT_TRUE(s->closed());
  }
  EXPECT_GE(SecondsSince(t), 0.5);
  // 20 headers are fine (Get adds Host and Connection).
  std::string twenty;
  for (int i = 0; i < 18; ++i) twenty += "X-" + std::to_string(i) + ": 1\r\n";
  EXPECT_EQ(StatusOf(ts.Get("/hello", twenty)), 200);
}

TEST(HardenedServer, AnIdleConnectionIsClosedSilently) {
  TestServer ts;
  RawHttp idle(ts.address, false);
  const std::string r = idle.Read(5);
  EXPECT_TRUE(r.empty()) << r;
  EXPECT_TRUE(idle.closed());
}

std::string Chunked(size_t n) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", n);
  return std::string(size) + std::string(n, 'b') + "\r\n0\r\n\r\n";
}

TEST(HardenedServer, ChunkedBodiesAreCountedExactly) {
  TestServer ts;
  const std::string head = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n";
  {
    RawHttp c(ts.address, false);
    c.Send(head + "Connection: close\r\n\r\n" + Chunked(1000));
    const std::string r = c.Read(10);
    EXPECT_EQ(StatusOf(r), 200);
    EXPECT_EQ(testing::BodyOf(r), std::string(1000, 'b'));
  }
  {
    RawHttp c(ts.address, false);  // keep-alive asked, but the refusal closes
    c.Send(head + "\r\n" + Chunked(1001));
    const std::string r = c.Read(10);
    EXPECT_EQ(StatusOf(r), 413) << r;
    EXPECT_TRUE(c.closed());
  }
  {
    RawHttp c(ts.address, false);  // endless tiny chunks: the wire cap
    c.Send(head + "\r\n");
    bool sent = true;
    for (int i = 0; i < 100000 && sent; ++i)
      sent = c.Send("0001;ext=xxxxxxxxxxxxxxxxxxxx\r\nb\r\n");
    EXPECT_EQ(StatusOf(c.Read(10)), 413);
  }
  for (const std::string bad :
       {"Content-Encoding: gzip\r\nContent-Length: 3\r\n", "Transfer-Encoding: gzip\r\n",
        "Content-Length: 5001\r\n", "Content-Length: 3\r\nContent-Length: 4\r\n"}) {
    RawHttp c(ts.address, false);
    c.Send("POST /echo HTTP/1.1\r\nHost: x\r\n" + bad + "\r\nabc");
    const int status = StatusOf(c.Read(10));
    EXPECT_TRUE(status == 415 || status == 501 || status == 413 || status == 400) << bad;
    EXPECT_TRUE(c.closed()) << bad;
  }
  // A body for a path without a route is not read: 404 at once.
  RawHttp nowhere(ts.address, false);
  nowhere.Send("POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\nabc");
  const Clock::time_point asked = Clock::now();
  EXPECT_EQ(StatusOf(nowhere.Read(10)), 404);
  EXPECT_LT(SecondsSince(asked), 0.5) << "waited for a body no route reads";
  RawHttp slow(ts.address, false);
  slow.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc");
  const std::string r = slow.Read(10);
  EXPECT_EQ(StatusOf(r), 408) << r;  // the body deadline
}

// A client that half-closes after its request (nc -N) is not gone: the
// handler sees a "100 Continue" probe succeed and the answer arrives. A
// client that closes for good is gone (the probe draws a reset).
TEST(HardenedServer, HalfCloseIsNotGoneAndGetsTheAnswer) {
  TestServer ts;
  {
    RawHttp c(ts.address, false);
    c.Send("GET /gone HTTP/1.1\r\nHost: x\r\n\r\n");
    c.HalfClose();
    const std::string r = c.Read(10);
    EXPECT_EQ(StatusOf(r), 200) << r;
    EXPECT_EQ(testing::BodyOf(r), "stayed");
    EXPECT_EQ(r.rfind("HTTP/1.1 100 Continue\r\n\r\n", 0), 0u) << r;
  }
  ts.gone_known = false;
  {
    RawHttp c(ts.address, false);
    c.Send("GET /gone?until-gone HTTP/1.1\r\nHost: x\r\n\r\n");
  }
  const Clock::time_point t = Clock::now();
  while (!ts.gone_known && SecondsSince(t) < 15) std::this_thread::yield();
  EXPECT_TRUE(ts.gone_known);
  EXPECT_TRUE(ts.gone);
}

// Stop: an idle keep-alive connection and a half-sent head close at once;
// the request in a handler finishes and its connection closes; Serve returns.
TEST(HardenedServer, StopClosesWhatIsNotInAHandler) {
  auto ts = std::make_unique<TestServer>();
  RawHttp idle(ts->address, false);
  idle.Send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(StatusOf(idle.Read(5, "hi")), 200);
  RawHttp half(ts->address, false);
  half.Send("GET /hello HTTP/1.1\r\n");
  RawHttp busy(ts->address, false);
  busy.Send("GET /wait HTTP/1.1\r\nHost: x\r\n\r\n");
  ts->gate.AwaitWaiters(1);
  const Clock::time_point t = Clock::now();
  ts->server.Stop();
  idle.Read(5);
  half.Read(5);
  EXPECT_TRUE(idle.closed());
  EXPECT_TRUE(half.closed());
  EXPECT_LT(SecondsSince(t), 0.5);
  ts->gate.Open();
  const std::string r = busy.Read(5);
  EXPECT_EQ(StatusOf(r), 200);
  EXPECT_NE(r.find("Connection: close"), std::string::npos) << r;
  ts->thread.join();
}

// A handler stuck writing to a client that never reads is shut down at the
// hard deadline.
TEST(HardenedServer, TheHardDeadlineEndsAStuckHandler) {
  auto ts = std::make_unique<TestServer>(TestServer::Options(), "127.0.0.1", [](HardenedServer& s) {
    s.Get("/forever", [](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("text/plain", [](size_t, httplib::DataSink& sink) {
        const std::string block(65536, 'z');
        while (sink.write(block.data(), block.size())) {
        }
        return false;
      });
    });
  });
  RawHttp reader(ts->address, false, /*rcvbuf=*/4096);
  reader.Send("GET /forever HTTP/1.1\r\nHost: x\r\n\r\n");
  reader.Read(0.2);  // the stream has started
  const Clock::time_point t = Clock::now();
  ts->server.Stop(Clock::now() + std::chrono::milliseconds(300));
  ts->thread.join();
  EXPECT_LT(SecondsSince(t), 3);
}

TEST(HardenedServer, ConnectionsFromOneAddressAreCapped) {
  TestServer ts;
  std::vector<std::unique_ptr<RawHttp>> open;
  for (int i = 0; i < 16; ++i) open.push_back(std::make_unique<RawHttp>(ts.address, false));
  RawHttp extra(ts.address, false);
  EXPECT_EQ(StatusOf(extra.Read(5)), 503);
  open.clear();
  bool served = false;
  for (int i = 0; i < 200 && !served; ++i) served = StatusOf(ts.Get("/hello")) == 200;
  EXPECT_TRUE(served);
}

TEST(HardenedServer, ListensOnIpv6Loopback) {
  if (!testing::Ipv6LoopbackWorks()) GTEST_SKIP() << "no IPv6 loopback";
  TestServer ts(TestServer::Options(), "::1");
  RawHttp c(ts.address, false);
  c.Send("GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(testing::BodyOf(c.Read(10)), "hi");
}

}  // namespace
}  // namespace meshnet::http
