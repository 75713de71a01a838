// The registry's page (cpp-httplib): GET / is a live HTML view (status.html,
// compiled in), GET /status.json the StatusJson, GET /metrics the Prometheus
// text, each built from the registry at request time. Works over any backend.
//
// Hostile clients: one request per connection, which must arrive whole
// within request_deadline_s and within max_request_bytes (a client dripping
// bytes holds a thread for that long at most); at most max_per_ip
// connections of one client address at once, more are closed at once. A
// Range header is honoured as one range of a GET only (http::NormalizeRequest;
// several ranges get the whole page once).
//
// Thread-safety: Start/Stop from one thread; refused_connections from any.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "registry/registry.h"

namespace httplib {
class Server;
}

namespace meshnet::registry {

struct StatusHttpOptions {
  int threads = 8;
  int max_per_ip = 4;
  double request_deadline_s = 2.0;
  size_t max_request_bytes = 64 << 10;
};

class StatusHttpServer {
 public:
  // `registry` must outlive the server.
  explicit StatusHttpServer(Registry* registry, StatusHttpOptions options = {});
  ~StatusHttpServer();  // Stop()
  // Binds host:port (port 0: a free one), serves on a thread; returns the bound
  // "host:port". kUnavailable when the address cannot be bound.
  std::string Start(const std::string& listen);
  void Stop();
  // Connections closed at once (over max_per_ip).
  int64_t refused_connections() const;

 private:
  class GuardedServer;
  Registry* registry_;
  StatusHttpOptions options_;
  std::unique_ptr<GuardedServer> http_;
  std::thread thread_;
};

}  // namespace meshnet::registry
