// The HTTP front door: routes, API-key auth, OpenAI-style error bodies for
// every failure, request metrics, and the embedded chat page, on the
// hardened server (http/hardened_server.h: cpp-httplib's parsing and routing
// on meshnet's connections, with head, body and connection limits checked
// before any handler or key).
//
//   Engine engine(...);
//   ApiServer server(&engine, options);
//   int port = server.Bind("127.0.0.1", 0);
//   std::thread t([&] { server.Serve(); });   // until Stop()
//
// Thread-safety: Stop() may be called from any thread while Serve() runs.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace meshnet::http {
class HardenedServer;
}

namespace meshnet::api {

class Engine;

struct ServerOptions {
  std::string api_key;   // non-empty: Bearer token required on API routes
  std::string tls_cert;  // both set: HTTPS
  std::string tls_key;
  size_t max_body_bytes = 1 << 20;
  int worker_threads = 16;           // requests served at once
  double head_timeout_s = 10;        // a request head must arrive within this (408)
  double body_timeout_s = 60;        // its body within this after the head (408)
  size_t max_head_bytes = 64 << 10;  // request line and headers (431)
  int max_header_count = 128;        // header lines (431)
  int max_connections = 512;         // open at once (503 beyond)
  int max_connections_per_ip = 64;   // from one IPv4 address or IPv6 /64 (503 beyond)
};

class ApiServer {
 public:
  // Throws Error(kInvalidArgument) for unreadable TLS files.
  ApiServer(Engine* engine, ServerOptions options);
  ~ApiServer();

  // Binds host:port (port 0: a free one; IPv6 as ::1 or [::1]) and returns
  // the port. Throws Error(kUnavailable) when the address cannot be bound.
  int Bind(const std::string& host, int port);
  // Serves until Stop(); returns after in-flight requests have finished.
  void Serve();
  // Stops accepting and closes every connection not in a handler (idle ones,
  // unfinished heads); Serve() returns once in-flight handlers are done, or
  // at `hard_deadline`, when the connections left are shut down.
  void Stop(std::chrono::steady_clock::time_point hard_deadline =
                std::chrono::steady_clock::time_point::max());

 private:
  void Routes();

  Engine* engine_;
  ServerOptions options_;
  std::unique_ptr<http::HardenedServer> http_;
};

}  // namespace meshnet::api
