#include "http/connection_hub.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "util/error.h"

namespace meshnet::http {
namespace {

constexpr int kAcceptsPerWake = 64;

int MakeWakeFd() {
  const int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) throw Error(ErrorKind::kUnavailable, "eventfd failed");
  return fd;
}

}  // namespace

ConnectionHub::ConnectionHub(int listen_fd, const TlsContext* tls, ConnectionLimits limits,
                             HubLimits hub, RefusalBody render)
    : listen_fd_(listen_fd),
      wake_fd_(MakeWakeFd()),
      tls_(tls),
      limits_(limits),
      hub_(hub),
      render_(std::move(render)) {}

ConnectionHub::~ConnectionHub() {
  if (listen_fd_ >= 0) close(listen_fd_);
  close(wake_fd_);
}

void ConnectionHub::Wake() {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = write(wake_fd_, &one, sizeof one);
}

bool ConnectionHub::stopping() const {
  MutexLock lock(&mu_);
  return stopping_;
}

int ConnectionHub::open_connections() const {
  MutexLock lock(&mu_);
  return open_;
}

void ConnectionHub::Stop(Clock::time_point hard_deadline) {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    hard_deadline_ = std::min(hard_deadline_, hard_deadline);
  }
  ready_cv_.SignalAll();
  Wake();
}

std::unique_ptr<Connection> ConnectionHub::TakeReady() {
  MutexLock lock(&mu_);
  while (ready_.empty() && !stopping_) ready_cv_.Wait();
  if (ready_.empty()) return nullptr;
  std::unique_ptr<Connection> conn = std::move(ready_.front());
  ready_.pop_front();
  active_.insert(conn.get());
  return conn;
}

void ConnectionHub::Return(std::unique_ptr<Connection> conn, bool keep) {
  if (keep) {
    conn->AwaitNextRequest();
  } else {
    conn->Linger();
  }
  {
    MutexLock lock(&mu_);
    active_.erase(conn.get());
    returned_.push_back(std::move(conn));
  }
  Wake();
}

void ConnectionHub::Destroy(std::unique_ptr<Connection> conn) {
  {
    MutexLock lock(&mu_);
    --open_;
    if (auto it = per_ip_.find(conn->peer_key()); it != per_ip_.end() && --it->second <= 0) {
      per_ip_.erase(it);
    }
  }
  conn.reset();  // closes the socket
}

void ConnectionHub::AcceptSome() {
  for (int i = 0; i < kAcceptsPerWake; ++i) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        accept_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
      }
      return;  // EAGAIN: no more for now
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // tokens go out one by one
    SSL* ssl = tls_ != nullptr ? tls_->NewSession(fd) : nullptr;
    if (tls_ != nullptr && ssl == nullptr) {
      close(fd);
      continue;
    }
    auto conn = std::make_unique<Connection>(fd, ssl, limits_);
    bool over = false;
    {
      MutexLock lock(&mu_);
      int& mine = per_ip_[conn->peer_key()];
      over = open_ >= hub_.max_connections || mine >= hub_.max_connections_per_ip;
      if (!over) {
        ++open_;
        ++mine;
      } else if (mine == 0) {
        per_ip_.erase(conn->peer_key());
      }
    }
    if (over) {
      // Answered without a handshake or a linger (plain text even on a TLS
      // port: the cheapest refusal); the client may see a reset instead.
      if (tls_ == nullptr) {
        conn->RefuseAndLinger(
            {503, "too many connections from this address", "too_many_connections"}, render_);
      }
      continue;  // destroyed uncounted
    }
    waiting_.push_back(std::move(conn));
    Connection::Step s = waiting_.back()->Advance(render_);  // the request may be here already
    if (s == Connection::Step::kReady) {
      Dispatch(std::move(waiting_.back()));
      waiting_.pop_back();
    } else if (s == Connection::Step::kClosed) {
      Destroy(std::move(waiting_.back()));
      waiting_.pop_back();
    }
  }
}

void ConnectionHub::Dispatch(std::unique_ptr<Connection> conn) {
  {
    MutexLock lock(&mu_);
    if (!stopping_ && ready_.size() < hub_.max_ready) {
      ready_.push_back(std::move(conn));
      ready_cv_.Signal();
      return;
    }
  }
  conn->RefuseAndLinger({503, "the server is busy or stopping; retry later", "server_busy"},
                        render_);
  waiting_.push_back(std::move(conn));
}

void ConnectionHub::TakeReturned() {
  std::vector<std::unique_ptr<Connection>> back;
  {
    MutexLock lock(&mu_);
    back.swap(returned_);
  }
  for (auto& conn : back) {
    waiting_.push_back(std::move(conn));
    // A pipelined request, or TLS bytes OpenSSL already decrypted, raise no
    // poll event: look at once.
    const Connection::Step s = waiting_.back()->Advance(render_);
    if (s == Connection::Step::kReady) {
      Dispatch(std::move(waiting_.back()));
      waiting_.pop_back();
    } else if (s == Connection::Step::kClosed) {
      Destroy(std::move(waiting_.back()));
      waiting_.pop_back();
    }
  }
}

void ConnectionHub::CloseAllWaiting() {
  for (auto& conn : waiting_) Destroy(std::move(conn));
  waiting_.clear();
  std::deque<std::unique_ptr<Connection>> ready;
  {
    MutexLock lock(&mu_);
    ready.swap(ready_);
  }
  for (auto& conn : ready) Destroy(std::move(conn));
}

bool ConnectionHub::Finished() {
  std::vector<Connection*> to_shut;
  {
    MutexLock lock(&mu_);
    if (!stopping_) return false;
    if (active_.empty() && returned_.empty()) return true;
    if (Clock::now() >= hard_deadline_ && !shut_active_) {
      shut_active_ = true;
      to_shut.assign(active_.begin(), active_.end());
    }
  }
  // Still alive: a connection leaves active_ for returned_, which only this
  // (the poller's) thread empties.
  for (Connection* c : to_shut) c->ShutdownNow();
  return false;
}

void ConnectionHub::Run() {
  while (true) {
    TakeReturned();
    if (stopping()) {
      if (listen_fd_ >= 0) close(listen_fd_);
      listen_fd_ = -1;
      CloseAllWaiting();
      if (Finished()) return;
    }
    PollOnce();
  }
}

void ConnectionHub::PollOnce() {
  const Clock::time_point now = Clock::now();
  std::vector<pollfd> fds = {{wake_fd_, POLLIN, 0}};
  const bool accepting = listen_fd_ >= 0 && now >= accept_paused_until_;
  if (accepting) fds.push_back({listen_fd_, POLLIN, 0});
  const size_t first_conn = fds.size();
  Clock::time_point next = now + std::chrono::seconds(1);
  if (!accepting && listen_fd_ >= 0) next = std::min(next, accept_paused_until_);
  {
    MutexLock lock(&mu_);
    if (stopping_) next = std::min(next, std::max(now, hard_deadline_));
  }
  for (const auto& conn : waiting_) {
    fds.push_back({conn->socket(), conn->poll_events(), 0});
    next = std::min(next, conn->deadline());
  }
  const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
  if (poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(wait + 1, 0, 1000))) < 0 &&
      errno != EINTR) {
    return;
  }
  if ((fds[0].revents & POLLIN) != 0) {
    uint64_t n;
    [[maybe_unused]] const ssize_t r = read(wake_fd_, &n, sizeof n);
  }
  const Clock::time_point after = Clock::now();
  std::vector<std::unique_ptr<Connection>> keep, ready;
  for (size_t i = 0; i < waiting_.size(); ++i) {
    std::unique_ptr<Connection>& conn = waiting_[i];
    Connection::Step s = Connection::Step::kWaiting;
    if (fds[first_conn + i].revents != 0) s = conn->Advance(render_);
    if (s == Connection::Step::kWaiting && after >= conn->deadline()) s = conn->Expire(render_);
    if (s == Connection::Step::kClosed) {
      Destroy(std::move(conn));
    } else if (s == Connection::Step::kReady) {
      ready.push_back(std::move(conn));
    } else {
      keep.push_back(std::move(conn));
    }
  }
  waiting_.swap(keep);
  for (auto& conn : ready) Dispatch(std::move(conn));
  if (accepting && (fds[1].revents & POLLIN) != 0) AcceptSome();
}

}  // namespace meshnet::http
