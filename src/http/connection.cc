#include "http/connection.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/host_port.h"

namespace meshnet::http {
namespace {

constexpr size_t kReadChunk = 16 << 10;
constexpr size_t kLingerBytes = 1 << 20;  // read and dropped at most, then closed anyway
constexpr int kProbeWaitMs = 50;

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// The numeric address and port of a socket address.
void Describe(const sockaddr_storage& a, socklen_t len, std::string* ip, int* port) {
  char host[NI_MAXHOST] = "";
  char serv[NI_MAXSERV] = "";
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    *ip = host;
    *port = std::atoi(serv);
  }
  if (ip->rfind("::ffff:", 0) == 0 && ip->find('.') != std::string::npos) *ip = ip->substr(7);
}

std::string CannedResponse(const Refusal& r, const RefusalBody& render) {
  const auto [type, body] = render(r);
  return "HTTP/1.1 " + std::to_string(r.status) + " " + StatusReason(r.status) +
         "\r\nContent-Type: " + type + "\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

}  // namespace

Connection::Connection(int fd, SSL* ssl, const ConnectionLimits& limits)
    : fd_(fd), ssl_(ssl), limits_(limits) {
  sockaddr_storage peer{}, local{};
  socklen_t peer_len = sizeof peer, local_len = sizeof local;
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0) {
    Describe(peer, peer_len, &peer_ip_, &peer_port_);
  }
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&local), &local_len) == 0) {
    Describe(local, local_len, &local_ip_, &local_port_);
  }
  peer_key_ = AddressKey(peer_ip_);  // an IPv4 address, or an IPv6 /64
  stage_ = ssl_ != nullptr ? Stage::kHandshake : Stage::kHead;
  deadline_ =
      Clock::now() + Seconds(ssl_ != nullptr ? limits_.head_timeout_s : limits_.idle_timeout_s);
}

Connection::~Connection() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  close(fd_);
}

ssize_t Connection::RawRead(char* p, size_t n) {
  want_write_ = false;
  if (ssl_ == nullptr) {
    while (true) {
      const ssize_t r = recv(fd_, p, n, MSG_DONTWAIT);
      if (r >= 0) return r;
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? -1 : -2;
    }
  }
  ERR_clear_error();
  const int r = SSL_read(ssl_, p, static_cast<int>(std::min<size_t>(n, 1 << 30)));
  if (r > 0) return r;
  switch (SSL_get_error(ssl_, r)) {
    case SSL_ERROR_WANT_READ:
      return -1;
    case SSL_ERROR_WANT_WRITE:
      want_write_ = true;
      return -1;
    case SSL_ERROR_ZERO_RETURN:
      return 0;  // close_notify
    case SSL_ERROR_SYSCALL:
      return errno == 0 ? 0 : -2;  // a FIN without close_notify
    default:
      return -2;
  }
}

ssize_t Connection::RawWrite(const char* p, size_t n) {
  want_write_ = true;
  if (ssl_ == nullptr) {
    while (true) {
      const ssize_t r = send(fd_, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (r >= 0) return r;
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? -1 : -2;
    }
  }
  // OpenSSL writes with write(2): SIGPIPE is ignored process-wide by
  // httplib::Server's constructor, which every hardened server runs.
  ERR_clear_error();
  const int r = SSL_write(ssl_, p, static_cast<int>(std::min<size_t>(n, 1 << 30)));
  if (r > 0) return r;
  switch (SSL_get_error(ssl_, r)) {
    case SSL_ERROR_WANT_WRITE:
      return -1;
    case SSL_ERROR_WANT_READ:
      want_write_ = false;
      return -1;
    default:
      return -2;
  }
}

Connection::Wait Connection::WaitReady(Clock::time_point until) {
  while (!shut_) {
    const Clock::time_point now = Clock::now();
    if (now >= until) return Wait::kTimeout;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
    pollfd p{fd_, poll_events(), 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (r > 0) return Wait::kReady;
    if (r < 0 && errno != EINTR) return Wait::kError;
  }
  return Wait::kError;
}

// ---- The poller's side.

Connection::Step Connection::Advance(const RefusalBody& render) {
  switch (stage_) {
    case Stage::kHandshake:
      return HandshakeStep() == Step::kClosed ? Step::kClosed
             : stage_ == Stage::kHead         ? HeadStep(render)
                                              : Step::kWaiting;
    case Stage::kHead:
      return HeadStep(render);
    case Stage::kLinger:
      return LingerStep();
    default:
      return Step::kWaiting;  // not the poller's
  }
}

Connection::Step Connection::HandshakeStep() {
  ERR_clear_error();
  const int r = SSL_accept(ssl_);
  if (r == 1) {
    stage_ = Stage::kHead;
    deadline_ = Clock::now() + Seconds(limits_.idle_timeout_s);
    return Step::kWaiting;
  }
  const int e = SSL_get_error(ssl_, r);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    want_write_ = e == SSL_ERROR_WANT_WRITE;
    return Step::kWaiting;
  }
  return Step::kClosed;  // not TLS, or a handshake OpenSSL refused
}

Connection::Step Connection::HeadStep(const RefusalBody& render) {
  const size_t cap = limits_.max_head_bytes;
  while (true) {
    // Empty lines before a request line are skipped (RFC 9112 2.2); httplib
    // would take the first one for a malformed request line.
    while (in_.compare(in_off_, 2, "\r\n") == 0) in_off_ += 2;
    const std::string_view buffered = std::string_view(in_).substr(in_off_);
    const size_t end = HeadEnd(buffered);
    if (end != std::string_view::npos) {
      if (HeaderCount(buffered.substr(0, end)) > limits_.max_header_count) {
        RefuseAndLinger({431,
                         "the request has more than " + std::to_string(limits_.max_header_count) +
                             " header lines",
                         "headers_too_large"},
                        render);
        return Step::kWaiting;
      }
      return Step::kReady;
    }
    if (buffered.size() > cap) {
      RefuseAndLinger({431, "the request head is larger than " + std::to_string(cap) + " bytes",
                       "headers_too_large"},
                      render);
      return Step::kWaiting;
    }
    char buf[kReadChunk];
    const ssize_t n = RawRead(buf, std::min(sizeof buf, cap + 1 - buffered.size()));
    if (n == -1) return Step::kWaiting;
    if (n <= 0) return Step::kClosed;  // the client left (or broke the stream)
    if (!head_started_) {
      head_started_ = true;
      deadline_ = Clock::now() + Seconds(limits_.head_timeout_s);
    }
    in_.append(buf, static_cast<size_t>(n));
  }
}

Connection::Step Connection::LingerStep() {
  char buf[kReadChunk];
  while (lingered_ < kLingerBytes) {
    const ssize_t n = recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Step::kWaiting;
    if (n <= 0) return Step::kClosed;
    lingered_ += static_cast<size_t>(n);
  }
  return Step::kClosed;
}

Connection::Step Connection::Expire(const RefusalBody& render) {
  if (stage_ == Stage::kHead && head_started_) {
    RefuseAndLinger({408,
                     "the request head did not arrive within " +
                         std::to_string(static_cast<int>(limits_.head_timeout_s)) + " s",
                     "request_timeout"},
                    render);
    return Step::kWaiting;
  }
  return Step::kClosed;  // an idle keep-alive wait, a handshake, a linger
}

void Connection::RefuseAndLinger(const Refusal& refusal, const RefusalBody& render) {
  const std::string answer = CannedResponse(refusal, render);
  RawWrite(answer.data(), answer.size());  // best effort: the socket buffer takes it
  Linger();
}

void Connection::Linger() {
  if (ssl_ != nullptr) {
    ERR_clear_error();
    SSL_shutdown(ssl_);  // close_notify, without waiting for the client's
  }
  shutdown(fd_, SHUT_WR);
  stage_ = Stage::kLinger;
  want_write_ = false;
  deadline_ = Clock::now() + Seconds(limits_.linger_s);
}

void Connection::AwaitNextRequest() {
  Compact();
  stage_ = Stage::kHead;
  head_started_ = false;
  has_body_ = false;
  probed_ = false;
  refusal_.reset();
  deadline_ = Clock::now() + Seconds(limits_.idle_timeout_s);
  if (in_off_ < in_.size()) {  // a pipelined request is already here
    head_started_ = true;
    deadline_ = Clock::now() + Seconds(limits_.head_timeout_s);
  }
}

void Connection::Compact() {
  in_.erase(0, in_off_);
  in_off_ = 0;
}

// ---- The worker's side.

void Connection::BeginBody(bool http10, bool has_body) {
  stage_ = Stage::kBody;
  http10_ = http10;
  has_body_ = has_body;
  body_wire_ = 0;
  deadline_ = Clock::now() + Seconds(limits_.body_timeout_s);
}

ssize_t Connection::Fill() {
  Compact();
  char buf[kReadChunk];
  while (true) {
    const ssize_t n = RawRead(buf, sizeof buf);
    if (n > 0) {
      in_.append(buf, static_cast<size_t>(n));
      return n;
    }
    if (n == 0 || n == -2) return n == 0 ? 0 : -1;
    const Wait w = WaitReady(deadline_);
    if (w == Wait::kTimeout) {
      const bool body = stage_ == Stage::kBody;
      SetRefusal(
          {408,
           std::string("the request ") + (body ? "body" : "head") + " did not arrive within " +
               std::to_string(
                   static_cast<int>(body ? limits_.body_timeout_s : limits_.head_timeout_s)) +
               " s",
           "request_timeout"});
    }
    if (w != Wait::kReady) return -1;
  }
}

ssize_t Connection::read(char* ptr, size_t size) {
  if (in_off_ == in_.size()) {
    const ssize_t n = Fill();
    if (n <= 0) return n;
  }
  const size_t n = std::min(size, in_.size() - in_off_);
  std::memcpy(ptr, in_.data() + in_off_, n);
  in_off_ += n;
  if (stage_ == Stage::kBody) {
    body_wire_ += n;
    // Chunk framing gets room on top of the payload; the payload itself is
    // counted exactly by the handler's reader (ReadBody).
    const size_t cap = limits_.max_body_bytes + limits_.max_body_bytes / 2 + (64 << 10);
    if (body_wire_ > cap) {
      SetRefusal({413,
                  "the request body is larger than the limit of " +
                      std::to_string(limits_.max_body_bytes) + " bytes (--max-body)",
                  "request_too_large"});
      return -1;
    }
  }
  return static_cast<ssize_t>(n);
}

ssize_t Connection::write(const char* ptr, size_t size) {
  size_t off = 0;
  Clock::time_point progress = Clock::now();
  while (off < size) {
    const ssize_t n = RawWrite(ptr + off, size - off);
    if (n > 0) {
      off += static_cast<size_t>(n);
      progress = Clock::now();
      continue;
    }
    if (n == -2 || WaitReady(progress + Seconds(limits_.write_timeout_s)) != Wait::kReady) {
      return -1;
    }
  }
  return static_cast<ssize_t>(size);
}

bool Connection::is_readable() const {
  return in_off_ < in_.size() || (ssl_ != nullptr && SSL_pending(ssl_) > 0);
}

bool Connection::is_writable() const { return !shut_; }

void Connection::get_remote_ip_and_port(std::string& ip, int& port) const {
  ip = peer_ip_;
  port = peer_port_;
}

void Connection::get_local_ip_and_port(std::string& ip, int& port) const {
  ip = local_ip_;
  port = local_port_;
}

bool Connection::ClientGone() {
  if (shut_) return true;
  pollfd p{fd_, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLHUP | POLLERR | POLLNVAL)) != 0) return true;
  if ((p.revents & POLLRDHUP) == 0) return false;
  if (http10_) return true;
  if (!probed_) {
    probed_ = true;
    static constexpr char kProbe[] = "HTTP/1.1 100 Continue\r\n\r\n";
    if (write(kProbe, sizeof kProbe - 1) < 0) return true;
    // A closed socket answers with a reset within a round trip; wait that
    // long once (events 0: only an error or hang-up ends the wait).
    pollfd q{fd_, 0, 0};
    return poll(&q, 1, kProbeWaitMs) > 0;
  }
  return false;
}

void Connection::ShutdownNow() {
  shut_ = true;
  shutdown(fd_, SHUT_RDWR);
}

}  // namespace meshnet::http
