#include "http/hardened_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "util/error.h"

namespace meshnet::http {
namespace {

thread_local Connection* t_current = nullptr;

class ScopedCurrent {
 public:
  explicit ScopedCurrent(Connection* c) { t_current = c; }
  ~ScopedCurrent() { t_current = nullptr; }
  ScopedCurrent(const ScopedCurrent&) = delete;
  ScopedCurrent& operator=(const ScopedCurrent&) = delete;
};

std::pair<std::string, std::string> PlainRefusal(const Refusal& r) {
  return {"text/plain; charset=utf-8", r.message + "\n"};
}

int ListenOn(const addrinfo& a) {
  const int fd = socket(a.ai_family, a.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a.ai_protocol);
  if (fd < 0) return -1;
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, a.ai_addr, a.ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int BoundPort(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return -1;
  char serv[NI_MAXSERV] = "";
  getnameinfo(reinterpret_cast<sockaddr*>(&a), len, nullptr, 0, serv, sizeof serv, NI_NUMERICSERV);
  return std::atoi(serv);
}

}  // namespace

Connection* CurrentConnection() { return t_current; }

HardenedServer::HardenedServer(HardenedOptions options) : options_(std::move(options)) {
  if (options_.tls_cert.empty() != options_.tls_key.empty()) {
    ThrowInvalidArgument("--tls-cert and --tls-key go together");
  }
  if (!options_.tls_cert.empty()) tls_ = TlsContext::Load(options_.tls_cert, options_.tls_key);
  if (!options_.refusal_body) options_.refusal_body = PlainRefusal;
  if (options_.worker_threads < 1) ThrowInvalidArgument("a server needs a worker thread");
  set_payload_max_length(options_.connection.max_body_bytes);
  set_keep_alive_max_count(options_.keep_alive_max_requests);
  set_keep_alive_timeout(static_cast<time_t>(options_.connection.idle_timeout_s));
  InstallGuards();
}

HardenedServer::~HardenedServer() = default;

void HardenedServer::SetErrorHandler(Handler handler) { user_error_ = std::move(handler); }

void HardenedServer::Get(const std::string& pattern, Handler handler) {
  httplib::Server::Get(pattern, std::move(handler));
}
void HardenedServer::Options(const std::string& pattern, Handler handler) {
  httplib::Server::Options(pattern, std::move(handler));
}
void HardenedServer::Post(const std::string& pattern, HandlerWithContentReader handler) {
  httplib::Server::Post(pattern, std::move(handler));
}
void HardenedServer::Put(const std::string& pattern, HandlerWithContentReader handler) {
  httplib::Server::Put(pattern, std::move(handler));
}
void HardenedServer::Patch(const std::string& pattern, HandlerWithContentReader handler) {
  httplib::Server::Patch(pattern, std::move(handler));
}
void HardenedServer::Delete(const std::string& pattern, HandlerWithContentReader handler) {
  httplib::Server::Delete(pattern, std::move(handler));
}

// After every route (httplib tries them in order): a body method on any
// other path is a 404 without its body read (httplib would read it whole
// into the request first, before routing to nothing).
void HardenedServer::AddCatchAlls() {
  auto not_found = [](const httplib::Request&, httplib::Response& res,
                      const httplib::ContentReader&) { res.status = 404; };
  httplib::Server::Post(".*", not_found);
  httplib::Server::Put(".*", not_found);
  httplib::Server::Patch(".*", not_found);
  httplib::Server::Delete(".*", not_found);
}

void HardenedServer::InstallGuards() {
  const size_t max_body = options_.connection.max_body_bytes;
  // Framing checks, before the body is read and before any handler (so
  // before credentials): a refusal is answered and closes the connection.
  set_pre_routing_handler([max_body](const httplib::Request& req, httplib::Response& res) {
    Connection* c = CurrentConnection();
    if (auto r = CheckFraming(req, max_body); r && c != nullptr) {
      res.status = r->status;
      c->SetRefusal(*r);
      return HandlerResponse::Handled;
    }
    return HandlerResponse::Unhandled;
  });
  // The same before a "100 Continue" invites the body.
  set_expect_100_continue_handler([max_body](const httplib::Request& req, httplib::Response& res) {
    Connection* c = CurrentConnection();
    if (auto r = CheckFraming(req, max_body); r && c != nullptr) {
      res.status = r->status;
      c->SetRefusal(*r);
      return r->status;
    }
    return 100;
  });
  httplib::Server::set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    Connection* c = CurrentConnection();
    if (c != nullptr && c->refusal()) {
      res.status = c->refusal()->status;
      const auto [type, body] = options_.refusal_body(*c->refusal());
      res.set_content(body, type);
      return;
    }
    if (user_error_) user_error_(req, res);
  });
  // Last word on keep-alive: a failed request with a body (left unread)
  // closes, as does every connection once stopping.
  set_post_routing_handler([this](const httplib::Request&, httplib::Response& res) {
    Connection* c = CurrentConnection();
    if (c == nullptr) return;
    if (res.status >= 400 && c->has_body()) c->CloseAfterResponse();
    if (c->close_after() || stop_requested_) {
      c->CloseAfterResponse();
      res.headers.erase("Keep-Alive");
      if (!res.has_header("Connection")) res.set_header("Connection", "close");
    }
  });
}

int HardenedServer::Bind(const std::string& host_in, int port) {
  std::string host = host_in;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  int fd = -1;
  for (addrinfo* a = rc == 0 ? res : nullptr; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ListenOn(*a);
  }
  if (res != nullptr) freeaddrinfo(res);
  if (fd < 0) {
    throw Error(ErrorKind::kUnavailable,
                "cannot listen on " + host_in + ":" + std::to_string(port) + " (address in use?)");
  }
  listen_fd_ = fd;
  // httplib's content providers run while its server socket is valid.
  svr_sock_ = fd;
  hub_ = std::make_unique<ConnectionHub>(fd, tls_.get(), options_.connection, options_.hub,
                                         options_.refusal_body);
  return BoundPort(fd);
}

void HardenedServer::Serve() {
  if (!hub_) ThrowInvalidArgument("Serve() before Bind()");
  AddCatchAlls();
  {
    MutexLock lock(&stop_mu_);
    if (stop_requested_) hub_->Stop(stop_deadline_);
  }
  std::vector<std::thread> workers;
  for (int i = 0; i < options_.worker_threads; ++i) workers.emplace_back([this] { WorkerLoop(); });
  hub_->Run();
  for (auto& t : workers) t.join();
  svr_sock_ = INVALID_SOCKET;
}

void HardenedServer::Stop(Clock::time_point hard_deadline) {
  MutexLock lock(&stop_mu_);
  stop_deadline_ = hard_deadline;
  stop_requested_ = true;
  if (hub_) hub_->Stop(hard_deadline);
}

int HardenedServer::open_connections() const { return hub_ ? hub_->open_connections() : 0; }

void HardenedServer::WorkerLoop() {
  while (std::unique_ptr<Connection> conn = hub_->TakeReady()) {
    bool keep = false;
    ServeConnection(*conn, &keep);
    hub_->Return(std::move(conn), keep);
  }
}

void HardenedServer::ServeConnection(Connection& conn, bool* keep) {
  const ScopedCurrent current(&conn);
  conn.BeginRequest();
  const bool last = stop_requested_ || conn.requests_served() >= options_.keep_alive_max_requests;
  bool closed = false;
  const bool ok = process_request(conn, last, closed, [&conn](httplib::Request& req) {
    NormalizeRequest(req);
    conn.BeginBody(req.version == "HTTP/1.0", HasBody(req));
  });
  *keep = ok && !closed && !last && !conn.close_after() && !stop_requested_;
}

std::optional<Refusal> ReadBody(const httplib::ContentReader& reader, size_t max_bytes,
                                std::string* out) {
  bool over = false;
  const bool ok = reader([&](const char* data, size_t n) {
    if (out->size() + n > max_bytes) {
      over = true;
      return false;
    }
    out->append(data, n);
    return true;
  });
  if (ok && !over) return std::nullopt;
  Connection* c = CurrentConnection();
  Refusal r{400, "the request body is malformed or was cut short", "bad_body"};
  if (over) {
    r = {413,
         "the request body is larger than the limit of " + std::to_string(max_bytes) +
             " bytes (--max-body)",
         "request_too_large"};
  } else if (c != nullptr && c->refusal()) {
    r = *c->refusal();
  }
  if (c != nullptr) c->SetRefusal(r);
  return r;
}

}  // namespace meshnet::http
