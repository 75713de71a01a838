#include "registry/status_http.h"

#include <httplib.h>

#include "registry/status.h"
#include "registry/status_html.h"  // generated from status.html (CMake)
#include "util/error.h"

namespace meshnet::registry {

StatusHttpServer::StatusHttpServer(Registry* registry) : registry_(registry) {}

StatusHttpServer::~StatusHttpServer() { Stop(); }

std::string StatusHttpServer::Start(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) ThrowInvalidArgument("expected host:port, got '" + listen + "'");
  const std::string host = listen.substr(0, colon);
  int port = 0;
  try {
    port = std::stoi(listen.substr(colon + 1));
  } catch (const std::exception&) {
    ThrowInvalidArgument("expected host:port, got '" + listen + "'");
  }
  http_ = std::make_unique<httplib::Server>();
  http_->set_read_timeout(3, 0);
  http_->new_task_queue = [] { return new httplib::ThreadPool(4); };
  auto status = [this] { return StatusJson(registry_->List(), registry_->name()); };
  auto guarded = [](httplib::Response& res, auto&& body) {
    try {
      body();
    } catch (const std::exception& e) {  // the registry is unreachable (etcd down)
      res.status = 503;
      res.set_content(nlohmann::json{{"error", e.what()}}.dump(), "application/json");
    }
  };
  http_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(reinterpret_cast<const char*>(kStatusHtml), sizeof kStatusHtml,
                    "text/html; charset=utf-8");
  });
  http_->Get("/status.json", [=](const httplib::Request&, httplib::Response& res) {
    guarded(res, [&] { res.set_content(status().dump(), "application/json"); });
  });
  http_->Get("/metrics", [=](const httplib::Request&, httplib::Response& res) {
    guarded(res, [&] { res.set_content(StatusMetrics(status()), "text/plain; version=0.0.4"); });
  });
  const int bound =
      port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    throw Error(ErrorKind::kUnavailable, "cannot serve the registry page on '" + listen + "'");
  }
  thread_ = std::thread([this] { http_->listen_after_bind(); });
  return host + ":" + std::to_string(bound);
}

void StatusHttpServer::Stop() {
  if (http_) http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace meshnet::registry
