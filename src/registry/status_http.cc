#include "registry/status_http.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "http/request_checks.h"
#include "registry/status.h"
#include "registry/status_html.h"  // generated from status.html (CMake)
#include "util/error.h"
#include "util/host_port.h"
#include "util/mutex.h"

namespace meshnet::registry {

namespace {

using Clock = std::chrono::steady_clock;

int PortOf(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
  return 0;
}

// A connection's stream with one deadline for the whole request and a cap
// on the bytes read: cpp-httplib's own stream times each read on its own, so
// a client sending a byte just before every timeout held a thread forever.
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(int fd, Clock::time_point deadline, size_t max_read)
      : fd_(fd), deadline_(deadline), max_read_(max_read) {}
  bool is_readable() const override { return Wait(POLLIN); }
  bool is_writable() const override { return Wait(POLLOUT); }
  ssize_t read(char* ptr, size_t size) override {
    if (read_ >= max_read_ || !Wait(POLLIN)) return -1;
    const ssize_t n = recv(fd_, ptr, std::min(size, max_read_ - read_), 0);
    if (n > 0) read_ += static_cast<size_t>(n);
    return n;
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!Wait(POLLOUT)) return -1;
    return send(fd_, ptr, size, MSG_NOSIGNAL);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    ip = SocketIp(a);
    port = PortOf(a);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    ip = SocketIp(a);
    port = PortOf(a);
  }
  int socket() const override { return fd_; }

 private:
  // Whether the socket is ready for `events` before the deadline.
  bool Wait(short events) const {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd_, events, 0};
    return poll(&p, 1, static_cast<int>(left)) == 1;
  }
  const int fd_;
  const Clock::time_point deadline_;
  const size_t max_read_;
  size_t read_ = 0;
};

}  // namespace

// cpp-httplib's Server with every connection served by one request under a
// whole-request deadline and a cap on the bytes it may send, and at most
// `per_ip` connections of one client address (an IPv4 address or an IPv6
// /64) at once (more are closed at
// once). cpp-httplib 0.11 has neither (its timeouts are per read); it lets a
// subclass serve a connection itself through its protected process_request.
// Requests are normalized as the API's are (http::NormalizeRequest: at most
// one range of a GET).
class StatusHttpServer::GuardedServer final : public httplib::Server {
 public:
  GuardedServer(double deadline_s, int per_ip, size_t max_request_bytes)
      : deadline_(
            std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(deadline_s))),
        per_ip_(per_ip),
        max_request_bytes_(max_request_bytes) {}

  int64_t refused() const {
    MutexLock lock(&mu_);
    return refused_;
  }

 private:
  bool process_and_close_socket(int sock) override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    getpeername(sock, reinterpret_cast<sockaddr*>(&a), &len);
    const std::string ip = SocketAddressKey(a);  // an IPv4 address or an IPv6 /64
    bool ok = false;
    if (Enter(ip)) {
      DeadlineStream stream(sock, Clock::now() + deadline_, max_request_bytes_);
      bool closed = false;
      // One range of a GET at most, as at the API's front door: thousands of
      // ranges would build a multipart reply thousands of pages long.
      ok = process_request(stream, /*close_connection=*/true, closed,
                           [](httplib::Request& req) { http::NormalizeRequest(req); });
      Leave(ip);
    }
    shutdown(sock, SHUT_RDWR);
    close(sock);
    return ok;
  }
  bool Enter(const std::string& ip) {
    MutexLock lock(&mu_);
    int& n = by_ip_[ip];
    if (n >= per_ip_) {
      ++refused_;
      return false;
    }
    ++n;
    return true;
  }
  void Leave(const std::string& ip) {
    MutexLock lock(&mu_);
    auto it = by_ip_.find(ip);
    if (it != by_ip_.end() && --it->second <= 0) by_ip_.erase(it);
  }

  const Clock::duration deadline_;
  const int per_ip_;
  const size_t max_request_bytes_;
  mutable Mutex mu_;
  std::unordered_map<std::string, int> by_ip_ GUARDED_BY(mu_);
  int64_t refused_ GUARDED_BY(mu_) = 0;
};

StatusHttpServer::StatusHttpServer(Registry* registry, StatusHttpOptions options)
    : registry_(registry), options_(options) {}

StatusHttpServer::~StatusHttpServer() { Stop(); }

int64_t StatusHttpServer::refused_connections() const { return http_ ? http_->refused() : 0; }

std::string StatusHttpServer::Start(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) ThrowInvalidArgument("expected host:port, got '" + listen + "'");
  std::string host = listen.substr(0, colon);
  int port = 0;
  try {
    port = std::stoi(listen.substr(colon + 1));
  } catch (const std::exception&) {
    ThrowInvalidArgument("expected host:port, got '" + listen + "'");
  }
  const std::string bind_host = host.size() >= 2 && host.front() == '[' && host.back() == ']'
                                    ? host.substr(1, host.size() - 2)
                                    : host;
  http_ = std::make_unique<GuardedServer>(options_.request_deadline_s, options_.max_per_ip,
                                          options_.max_request_bytes);
  http_->new_task_queue = [n = options_.threads] { return new httplib::ThreadPool(n); };
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
  const int bound = port == 0 ? http_->bind_to_any_port(bind_host)
                              : (http_->bind_to_port(bind_host, port) ? port : -1);
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
