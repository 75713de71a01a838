// The HTTP front door (cpp-httplib): routes, API-key auth, OpenAI-style error
// bodies for every failure, request metrics, and the embedded chat page.
//
//   Engine engine(...);
//   ApiServer server(&engine, options);
//   int port = server.Bind("127.0.0.1", 0);
//   std::thread t([&] { server.Serve(); });   // until Stop()
//
// Thread-safety: Stop() may be called from any thread while Serve() runs.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace httplib {
class Server;
}

namespace meshnet::api {

class Engine;

struct ServerOptions {
  std::string api_key;   // non-empty: Bearer token required on API routes
  std::string tls_cert;  // both set: HTTPS
  std::string tls_key;
  size_t max_body_bytes = 1 << 20;
  int worker_threads = 16;  // connections served at once
};

class ApiServer {
 public:
  // Throws Error(kInvalidArgument) for unreadable TLS files.
  ApiServer(Engine* engine, ServerOptions options);
  ~ApiServer();

  // Binds host:port (port 0: a free one) and returns the port. Throws
  // Error(kUnavailable) when the address cannot be bound.
  int Bind(const std::string& host, int port);
  // Serves until Stop(); returns after in-flight requests have finished.
  void Serve();
  // Stops accepting; Serve() returns once in-flight handlers are done.
  void Stop();

 private:
  void Routes();

  Engine* engine_;
  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  int listen_fd_ = -1;
};

}  // namespace meshnet::api
