#include "tests/tools/delay_proxy.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <deque>
#include <list>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace meshnet::testing {

namespace {

using Clock = std::chrono::steady_clock;

void NoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void NonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

int ConnectTo(const std::string& target) {
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos) return -1;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(target.substr(0, colon).c_str(), target.substr(colon + 1).c_str(), &hints,
                  &res) != 0) {
    return -1;
  }
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0;
  freeaddrinfo(res);
  if (!ok) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

// Bytes read from `from` on their way to `to`, each chunk due at its time.
struct Direction {
  struct Chunk {
    std::vector<char> bytes;
    size_t sent = 0;
    Clock::time_point due;
  };
  int from = -1, to = -1;
  std::deque<Chunk> queue;
  int64_t queued = 0;
  Clock::time_point link_free{};  // when the capped link has sent what it holds
  bool read_eof = false;          // `from` closed its side
  bool shut = false;              // passed on to `to`
};

}  // namespace

struct DelayProxy::Loop {
  std::mutex target_mu;
  std::string target;  // guarded by target_mu (SetTarget)
  Clock::duration delay;
  double rate = 0;
  int listen_fd = -1;
  struct Conn {
    Direction up, down;  // client -> target, target -> client
    bool dead = false;
  };
  std::list<Conn> conns;

  void Accept(std::atomic<int64_t>* accepted) {
    const int client = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) return;
    std::string to;
    {
      std::lock_guard<std::mutex> lock(target_mu);
      to = target;
    }
    const int upstream = to.empty() ? -1 : ConnectTo(to);
    if (upstream < 0) {
      close(client);
      return;
    }
    for (const int fd : {client, upstream}) {
      NoDelay(fd);
      NonBlocking(fd);
    }
    Conn& c = conns.emplace_back();
    c.up.from = c.down.to = client;
    c.up.to = c.down.from = upstream;
    ++*accepted;
  }

  void Read(Direction& d) {
    char buf[64 << 10];
    const ssize_t n = recv(d.from, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      d.read_eof = true;
      return;
    }
    if (n < 0) return;
    const Clock::time_point now = Clock::now();
    Clock::time_point sent = now;
    if (rate > 0) {
      const auto wire = std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(static_cast<double>(n) / rate));
      sent = std::max(now, d.link_free) + wire;
      d.link_free = sent;
    }
    d.queue.push_back({std::vector<char>(buf, buf + n), 0, sent + delay});
    d.queued += n;
  }

  // Sends what is due; false when `to` is gone.
  bool Write(Direction& d, Clock::time_point now) {
    while (!d.queue.empty() && d.queue.front().due <= now) {
      Direction::Chunk& c = d.queue.front();
      const ssize_t n = send(d.to, c.bytes.data() + c.sent, c.bytes.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0) return errno == EAGAIN || errno == EINTR;
      c.sent += static_cast<size_t>(n);
      if (c.sent < c.bytes.size()) return true;  // the socket is full
      d.queued -= static_cast<int64_t>(c.bytes.size());
      d.queue.pop_front();
    }
    if (d.queue.empty() && d.read_eof && !d.shut) {
      shutdown(d.to, SHUT_WR);
      d.shut = true;
    }
    return true;
  }
};

void DelayProxy::SetTarget(const std::string& target) {
  std::lock_guard<std::mutex> lock(loop_->target_mu);
  loop_->target = target;
}

DelayProxy::DelayProxy(const std::string& target, double delay_s, double rate_bytes_s,
                       int listen_port)
    : loop_(std::make_unique<Loop>()) {
  loop_->target = target;
  loop_->delay =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(delay_s));
  loop_->rate = rate_bytes_s;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(listen_port));
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 128) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || pipe2(wake_, O_CLOEXEC) != 0) {
    if (fd >= 0) close(fd);
    throw std::runtime_error("delay proxy: cannot listen on 127.0.0.1:" +
                             std::to_string(listen_port));
  }
  loop_->listen_fd = fd;
  port_ = ntohs(a.sin_port);
  thread_ = std::thread([this] { Run(); });
}

DelayProxy::~DelayProxy() {
  const char b = 1;
  (void)!write(wake_[1], &b, 1);
  thread_.join();
  for (auto& c : loop_->conns) {
    close(c.up.from);
    close(c.up.to);
  }
  close(loop_->listen_fd);
  close(wake_[0]);
  close(wake_[1]);
}

void DelayProxy::Run() {
  Loop& l = *loop_;
  std::vector<pollfd> fds;
  std::vector<Direction*> dirs;  // parallel to fds[2..]: the direction each fd reads
  for (;;) {
    const Clock::time_point now = Clock::now();
    Clock::time_point next = now + std::chrono::seconds(1);
    fds.assign({{l.listen_fd, POLLIN, 0}, {wake_[0], POLLIN, 0}});
    dirs.clear();
    for (auto& c : l.conns) {
      for (Direction* d : {&c.up, &c.down}) {
        short events = 0;
        if (!d->read_eof && d->queued < kMaxQueuedBytes) events |= POLLIN;
        if (!d->queue.empty()) {
          if (d->queue.front().due <= now) {
            fds.push_back({d->to, POLLOUT, 0});
            dirs.push_back(nullptr);  // a write slot: handled below by Write
          } else {
            next = std::min(next, d->queue.front().due);
          }
        }
        if (events != 0) {
          fds.push_back({d->from, events, 0});
          dirs.push_back(d);
        }
      }
    }
    // Woken to the microsecond (poll's whole milliseconds, rounded up, made
    // every crossing ~1-2 ms longer than the delay asked for).
    const int64_t wait_us = std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::microseconds>(next - now).count() + 1);
    const timespec wait{static_cast<time_t>(wait_us / 1000000),
                        static_cast<long>((wait_us % 1000000) * 1000)};
    ppoll(fds.data(), fds.size(), &wait, nullptr);
    if (fds[1].revents != 0) return;
    if (fds[0].revents & POLLIN) l.Accept(&accepted_);
    for (size_t i = 2; i < fds.size(); ++i) {
      if (dirs[i - 2] != nullptr && fds[i].revents != 0) l.Read(*dirs[i - 2]);
    }
    const Clock::time_point after = Clock::now();
    for (auto& c : l.conns) {
      if (!l.Write(c.up, after) || !l.Write(c.down, after)) c.dead = true;
      if (c.up.shut && c.down.shut) c.dead = true;
    }
    l.conns.remove_if([](Loop::Conn& c) {
      if (!c.dead) return false;
      close(c.up.from);
      close(c.up.to);
      return true;
    });
  }
}

}  // namespace meshnet::testing
