// The registry's page (cpp-httplib): GET / is a live HTML view (status.html,
// compiled in), GET /status.json the StatusJson, GET /metrics the Prometheus
// text, each built from the registry at request time. Works over any backend.
//
// Thread-safety: Start/Stop from one thread.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "registry/registry.h"

namespace httplib {
class Server;
}

namespace meshnet::registry {

class StatusHttpServer {
 public:
  explicit StatusHttpServer(Registry* registry);  // must outlive the server
  ~StatusHttpServer();                            // Stop()
  // Binds host:port (port 0: a free one), serves on a thread; returns the bound
  // "host:port". kUnavailable when the address cannot be bound.
  std::string Start(const std::string& listen);
  void Stop();

 private:
  Registry* registry_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
};

}  // namespace meshnet::registry
