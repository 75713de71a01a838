#include "rpc/kv_transfer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <list>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "node/identity.h"
#include "util/error.h"
#include "util/host_port.h"
#include "util/mutex.h"
#include "util/secret.h"

namespace meshnet::rpc {

namespace {

static_assert(std::endian::native == std::endian::little, "the frames are little-endian structs");

using Clock = std::chrono::steady_clock;

constexpr char kMagic[8] = {'M', 'K', 'V', 'X', 'F', 'E', 'R', '1'};
constexpr size_t kTicketBytes = 32;
constexpr uint32_t kChunkFrame = 1;
constexpr uint32_t kTrailerFrame = 2;
constexpr size_t kMaxMessage = 4096;
// Connections that have had their answer and are lingering (at most a
// linger's time each) may bring the total to this many times the caps.
constexpr int kLingerFactor = 2;
// After an error the server reads (and drops) what the client still sends,
// so that its status frame is read rather than lost to a reset; this bounds it.
constexpr int64_t kMaxDrainBytes = int64_t{1} << 30;

struct Frame {
  uint32_t kind = 0;
  uint32_t crc32c = 0;
  int64_t index = 0;
  int64_t first_position = 0;
  int64_t n_positions = 0;
  int64_t bytes = 0;
};
static_assert(sizeof(Frame) == 40);

struct StatusFrame {
  uint32_t status = 0;  // 0: imported; else 1 + ErrorKind
  uint32_t message_bytes = 0;
  int64_t seq_len = 0;
  int64_t bytes = 0;
  int64_t chunks = 0;
};
static_assert(sizeof(StatusFrame) == 32);

void SetIoTimeout(int fd, double seconds) {
  const double s = std::clamp(seconds, 0.001, 3600.0);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(s);
  tv.tv_usec = static_cast<suseconds_t>((s - static_cast<double>(tv.tv_sec)) * 1e6);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

[[noreturn]] void ThrowIo(const std::string& what) {
  const int e = errno;
  throw Error(ErrorKind::kUnavailable,
              what + ": " +
                  (e == EAGAIN || e == EWOULDBLOCK ? std::string("timed out") : std::strerror(e)));
}

// Reads exactly n bytes (kUnavailable on a timeout, an error or the end).
void ReadExact(int fd, void* data, size_t n, const char* what) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0) {
      throw Error(ErrorKind::kUnavailable, std::string("connection closed while reading ") + what);
    } else if (errno != EINTR) {
      ThrowIo(std::string("reading ") + what);
    }
  }
}

// Reads exactly the bytes of `runs`, scattered into them (recvmsg,
// IOV_MAX runs at a time): the kernel copies straight into the KV rows.
void ReadRuns(int fd, const std::vector<node::SessionImporter::Run>& runs) {
  std::vector<iovec> iov;
  iov.reserve(runs.size());
  for (const auto& [p, n] : runs) iov.push_back({p, n});
  size_t first = 0;
  while (first < iov.size()) {
    msghdr m{};
    m.msg_iov = iov.data() + first;
    m.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    ssize_t r = recvmsg(fd, &m, MSG_WAITALL);
    if (r == 0) throw Error(ErrorKind::kUnavailable, "connection closed while reading KV rows");
    if (r < 0) {
      if (errno == EINTR) continue;
      ThrowIo("reading KV rows");
    }
    while (first < iov.size() && r >= static_cast<ssize_t>(iov[first].iov_len)) {
      r -= static_cast<ssize_t>(iov[first].iov_len);
      ++first;
    }
    if (r > 0) {
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + r;
      iov[first].iov_len -= static_cast<size_t>(r);
    }
  }
}

// Writes every byte of `iov` (partial writes resumed, IOV_MAX at a time; no
// SIGPIPE).
void WriteAll(int fd, std::vector<iovec>& iov, const char* what) {
  size_t first = 0;
  while (first < iov.size()) {
    msghdr m{};
    m.msg_iov = iov.data() + first;
    m.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      ThrowIo(std::string("sending ") + what);
    }
    while (first < iov.size() && w >= static_cast<ssize_t>(iov[first].iov_len)) {
      w -= static_cast<ssize_t>(iov[first].iov_len);
      ++first;
    }
    if (w > 0) {
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + w;
      iov[first].iov_len -= static_cast<size_t>(w);
    }
  }
}

void WriteAll(int fd, const void* data, size_t n, const char* what) {
  std::vector<iovec> iov = {{const_cast<void*>(data), n}};
  WriteAll(fd, iov, what);
}

void SendStatus(int fd, const StatusFrame& f, const std::string& message) {
  StatusFrame out = f;
  const std::string text = message.substr(0, kMaxMessage);
  out.message_bytes = static_cast<uint32_t>(text.size());
  std::vector<iovec> iov = {{&out, sizeof out}, {const_cast<char*>(text.data()), text.size()}};
  WriteAll(fd, iov, "the status");
}

// After an error: the status is sent, then what the client still sends is
// read and dropped (bounded by bytes and by `linger_s` in all) so that
// closing does not reset the connection before the client reads the status.
void SendErrorAndLinger(int fd, const Error& e, double linger_s) {
  try {
    SendStatus(fd, StatusFrame{1 + static_cast<uint32_t>(e.kind())}, e.what());
    shutdown(fd, SHUT_WR);
    std::vector<char> sink(64 << 10);
    int64_t dropped = 0;
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(linger_s));
    while (dropped < kMaxDrainBytes && Clock::now() < until) {
      const ssize_t r = recv(fd, sink.data(), sink.size(), 0);
      if (r <= 0 && !(r < 0 && errno == EINTR)) break;
      if (r > 0) dropped += r;
    }
  } catch (const Error&) {
    // The client is gone: nothing more to tell it.
  }
}

// Reads exactly n bytes, all of them within `seconds` of now (a client that
// drips its bytes gets no longer than one that sends none).
void ReadWithin(int fd, void* data, size_t n, double seconds, const char* what) {
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(seconds));
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    pollfd pf{fd, POLLIN, 0};
    if (left <= 0 || poll(&pf, 1, static_cast<int>(left)) == 0) {
      throw Error(ErrorKind::kUnavailable, std::string("reading ") + what + ": timed out");
    }
    const ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0) {
      throw Error(ErrorKind::kUnavailable, std::string("connection closed while reading ") + what);
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      ThrowIo(std::string("reading ") + what);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// KvTransferListener

struct KvTransferListener::Impl {
  struct Pending {
    std::unique_ptr<node::SessionImporter> importer;
    Clock::time_point expires;
    std::string session_id;
  };
  struct Conn {
    int fd = -1;
    std::string ip;
    std::thread thread;
    // Set just before the connection's last frame is sent: from then on it
    // no longer counts against the caps that admit new ones (else a client
    // that saw the answer and came straight back could find its own old
    // connection, still lingering, in the way). Lingering ones are bounded
    // on their own (kLingerFactor).
    std::atomic<bool> answered{false};
    std::atomic<bool> done{false};
  };

  node::NodeCore* core = nullptr;
  KvTransferOptions options;
  int listen_fd = -1;
  int wake[2] = {-1, -1};  // a pipe: Stop wakes the acceptor's poll
  int port = 0;
  std::thread acceptor;

  Mutex mu;
  // Keyed by the SHA-256 of the ticket: a lookup's timing says nothing
  // about the tickets.
  std::unordered_map<std::string, Pending> pending GUARDED_BY(mu);
  std::list<Conn> conns GUARDED_BY(mu);
  bool stopped GUARDED_BY(mu) = false;
  int64_t refused GUARDED_BY(mu) = 0;

  // Whether a connection from `ip` may be served now (the limits).
  bool RoomForLocked(const std::string& ip) const REQUIRES(mu);

  void Bind();
  void AcceptLoop();
  void Serve(Conn& c);
  void Import(Conn& c, node::SessionImporter& imp);
  // Takes the offer of `ticket` if it is live.
  std::unique_ptr<node::SessionImporter> Take(const std::string& ticket);
  // Drops expired offers (their importers are destroyed outside the lock:
  // that undoes their claims in the NodeCore).
  void Sweep();
  // The connections whose threads are done.
  void FinishedLocked(std::vector<Conn*>* finished) REQUIRES(mu);
  bool FullLocked() const REQUIRES(mu) {
    return stopped || static_cast<int64_t>(pending.size()) >= options.max_pending;
  }
};

void KvTransferListener::Impl::Bind() {
  std::string host = options.host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port_text = std::to_string(options.port);
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &res) != 0 ||
      res == nullptr) {
    throw Error(ErrorKind::kUnavailable, "KV transfer port: cannot resolve '" + host + "'");
  }
  listen_fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (listen_fd >= 0) setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const bool ok = listen_fd >= 0 && bind(listen_fd, res->ai_addr, res->ai_addrlen) == 0 &&
                  listen(listen_fd, 16) == 0;
  freeaddrinfo(res);
  if (!ok) {
    const std::string why = std::strerror(errno);
    if (listen_fd >= 0) close(listen_fd);
    listen_fd = -1;
    throw Error(ErrorKind::kUnavailable, "KV transfer port: cannot listen on " + options.host +
                                             ":" + port_text + ": " + why);
  }
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  getsockname(listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port)
                                 : ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  if (pipe2(wake, O_CLOEXEC) != 0) {
    close(listen_fd);
    listen_fd = -1;
    ThrowIo("KV transfer port: pipe");
  }
}

bool KvTransferListener::Impl::RoomForLocked(const std::string& ip) const {
  int running = 0, from_ip = 0, alive = 0, alive_from_ip = 0;
  for (const Conn& c : conns) {
    if (c.done.load()) continue;
    ++alive;
    if (c.ip == ip) ++alive_from_ip;
    if (c.answered.load()) continue;
    ++running;
    if (c.ip == ip) ++from_ip;
  }
  const int cap = std::max(1, options.max_connections);
  const int cap_ip = std::max(1, options.max_connections_per_ip);
  return running < cap && from_ip < cap_ip && alive < kLingerFactor * cap &&
         alive_from_ip < kLingerFactor * cap_ip;
}

void KvTransferListener::Impl::FinishedLocked(std::vector<Conn*>* finished) {
  for (Conn& c : conns) {
    if (c.done.load()) finished->push_back(&c);
  }
}

void KvTransferListener::Impl::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
    // Wakes at least twice a second to expire offers nobody came for.
    const int n = poll(fds, 2, 500);
    if (fds[1].revents != 0) return;
    Sweep();
    {
      // Join the connections that ended (outside the lock: their threads
      // are done and take no lock on the way out).
      std::vector<Conn*> finished;
      {
        MutexLock lock(&mu);
        FinishedLocked(&finished);
      }
      for (Conn* c : finished) {
        c->thread.join();
        close(c->fd);
      }
      MutexLock lock(&mu);
      conns.remove_if([&](const Conn& c) {
        return std::find(finished.begin(), finished.end(), &c) != finished.end();
      });
    }
    if (n <= 0 || (fds[0].revents & POLLIN) == 0) continue;
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof peer;
    const int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &peer_len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    const std::string ip = SocketAddressKey(peer);  // an IPv4 address or an IPv6 /64
    MutexLock lock(&mu);
    if (stopped || !RoomForLocked(ip)) {
      close(fd);  // full: the client's push falls back to gRPC, or its offer expires
      ++refused;
      spdlog::warn("event=kv_transfer_refused peer={} reason=\"connection limit\"", ip);
      continue;
    }
    Conn& c = conns.emplace_back();
    c.fd = fd;
    c.ip = ip;
    c.thread = std::thread([this, &c] {
      Serve(c);
      c.done.store(true);
    });
  }
}

std::unique_ptr<node::SessionImporter> KvTransferListener::Impl::Take(const std::string& ticket) {
  const std::string key = SecretDigest(ticket);
  MutexLock lock(&mu);
  auto it = pending.find(key);
  if (it == pending.end() || Clock::now() >= it->second.expires) return nullptr;
  std::unique_ptr<node::SessionImporter> imp = std::move(it->second.importer);
  pending.erase(it);
  return imp;
}

void KvTransferListener::Impl::Sweep() {
  std::vector<std::unique_ptr<node::SessionImporter>> expired;
  {
    MutexLock lock(&mu);
    const auto now = Clock::now();
    for (auto it = pending.begin(); it != pending.end();) {
      if (now >= it->second.expires) {
        expired.push_back(std::move(it->second.importer));
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (!expired.empty()) spdlog::warn("event=kv_transfer_expired offers={}", expired.size());
}

void KvTransferListener::Impl::Serve(Conn& c) {
  const int fd = c.fd;
  std::unique_ptr<node::SessionImporter> imp;
  double linger_s = options.hello_timeout_s;  // until a live ticket came
  try {
    char hello[sizeof kMagic + kTicketBytes];
    ReadWithin(fd, hello, sizeof hello, options.hello_timeout_s, "the ticket");
    SetIoTimeout(fd, options.io_timeout_s);
    if (std::memcmp(hello, kMagic, sizeof kMagic) != 0) {
      ThrowInvalidArgument("KV transfer refused: not a meshnet KV transfer");
    }
    imp = Take(std::string(hello + sizeof kMagic, kTicketBytes));
    if (!imp) {
      throw Error(ErrorKind::kPermissionDenied,
                  "KV transfer refused: unknown, used or expired ticket");
    }
    linger_s = options.io_timeout_s;
    Import(c, *imp);
  } catch (const Error& e) {
    if (imp) core->counters().imports_rejected.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("event=kv_transfer_refused message=\"{}\"", e.what());
    c.answered.store(true);
    SendErrorAndLinger(fd, e, linger_s);
  } catch (const std::exception& e) {
    if (imp) core->counters().imports_rejected.fetch_add(1, std::memory_order_relaxed);
    spdlog::error("event=kv_transfer_failed message=\"{}\"", e.what());
    c.answered.store(true);
    SendErrorAndLinger(fd, Error(ErrorKind::kUnavailable, std::string("KV transfer: ") + e.what()),
                       linger_s);
  }
  imp.reset();  // undoes the claim unless it was committed
}

void KvTransferListener::Impl::Import(Conn& c, node::SessionImporter& imp) {
  const int fd = c.fd;
  auto read = [fd](const std::vector<node::SessionImporter::Run>& runs) { ReadRuns(fd, runs); };
  for (;;) {
    Frame f;
    ReadExact(fd, &f, sizeof f, "a frame");
    if (f.kind == kChunkFrame) {
      imp.AddDirect({f.index, f.first_position, f.n_positions, f.bytes, f.crc32c}, read);
    } else if (f.kind == kTrailerFrame) {
      imp.Finish({f.crc32c, f.bytes});
      break;
    } else {
      ThrowInvalidArgument("KV transfer refused: unknown frame kind " + std::to_string(f.kind));
    }
  }
  const int64_t seq_len = core->CommitImport(imp);
  core->counters().kv_transfers.fetch_add(1, std::memory_order_relaxed);
  c.answered.store(true);
  SendStatus(fd, StatusFrame{0, 0, seq_len, imp.bytes(), imp.chunks()}, "");
}

KvTransferListener::KvTransferListener(node::NodeCore* core, KvTransferOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->core = core;
  impl_->options = std::move(options);
  impl_->Bind();
  impl_->acceptor = std::thread([m = impl_.get()] { m->AcceptLoop(); });
}

KvTransferListener::~KvTransferListener() { Stop(); }

int KvTransferListener::port() const { return impl_->port; }

KvOffer KvTransferListener::Offer(node::SessionExportHeader header) {
  Impl& m = *impl_;
  m.Sweep();
  {
    MutexLock lock(&m.mu);
    if (m.FullLocked()) {
      throw Error(ErrorKind::kResourceExhausted,
                  "KV transfer: " + std::to_string(m.options.max_pending) +
                      " imports wait for their connection already; retry later");
    }
  }
  std::unique_ptr<node::SessionImporter> imp = m.core->BeginImport(std::move(header));
  KvOffer offer{node::RandomId128(), m.port, m.options.ticket_ttl_s};
  const auto ttl = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(m.options.ticket_ttl_s));
  {
    MutexLock lock(&m.mu);
    if (!m.FullLocked()) {
      const std::string session_id = imp->header().session_id;
      m.pending.emplace(SecretDigest(offer.ticket),
                        Impl::Pending{std::move(imp), Clock::now() + ttl, session_id});
      return offer;
    }
  }
  imp.reset();  // another offer took the last place meanwhile
  throw Error(ErrorKind::kResourceExhausted, "KV transfer: too many imports wait; retry later");
}

int64_t KvTransferListener::pending() {
  impl_->Sweep();
  MutexLock lock(&impl_->mu);
  return static_cast<int64_t>(impl_->pending.size());
}

void KvTransferListener::DropOffers(const std::string& session_id) {
  std::vector<std::unique_ptr<node::SessionImporter>> dropped;  // undone outside the lock
  {
    MutexLock lock(&impl_->mu);
    for (auto it = impl_->pending.begin(); it != impl_->pending.end();) {
      if (it->second.session_id == session_id) {
        dropped.push_back(std::move(it->second.importer));
        it = impl_->pending.erase(it);
      } else {
        ++it;
      }
    }
  }
}

int64_t KvTransferListener::refused_connections() const {
  MutexLock lock(&impl_->mu);
  return impl_->refused;
}

void KvTransferListener::Stop() {
  Impl& m = *impl_;
  {
    MutexLock lock(&m.mu);
    if (m.stopped) return;
    m.stopped = true;
  }
  const char byte = 0;
  if (write(m.wake[1], &byte, 1) < 0) spdlog::warn("event=kv_transfer_stop wake failed");
  if (m.acceptor.joinable()) m.acceptor.join();
  std::list<Impl::Conn> conns;
  std::unordered_map<std::string, Impl::Pending> pending;
  {
    MutexLock lock(&m.mu);
    conns.splice(conns.end(), m.conns);
    pending.swap(m.pending);
  }
  for (Impl::Conn& c : conns) {
    shutdown(c.fd, SHUT_RDWR);  // ends its blocking reads and writes
    c.thread.join();
    close(c.fd);
  }
  pending.clear();  // undoes the offers' claims
  close(m.listen_fd);
  close(m.wake[0]);
  close(m.wake[1]);
}

// ---------------------------------------------------------------------------
// The sending side

namespace {

// A TCP connection to host:port within `connect_timeout_s`.
int Connect(const std::string& host_in, int port, double connect_timeout_s) {
  std::string host = host_in;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string where = host_in + ":" + std::to_string(port);
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 ||
      res == nullptr) {
    throw Error(ErrorKind::kUnavailable, "KV transfer to " + where + ": cannot resolve the host");
  }
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int rc = fd < 0 ? -1 : connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (rc != 0 && fd >= 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    const int ms = static_cast<int>(std::clamp(connect_timeout_s, 0.001, 3600.0) * 1000);
    int err = ETIMEDOUT;
    socklen_t len = sizeof err;
    if (poll(&p, 1, ms) == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    rc = err == 0 ? 0 : -1;
    errno = err;
  }
  if (rc != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) close(fd);
    throw Error(ErrorKind::kUnavailable, "KV transfer to " + where + ": cannot connect: " + why);
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

struct Answer {
  StatusFrame frame;
  std::string message;
};

// The node's answer, or nothing when it cannot be read (closed, timed out).
std::optional<Answer> ReadAnswer(int fd) {
  try {
    Answer a;
    ReadExact(fd, &a.frame, sizeof a.frame, "the node's answer");
    a.message.resize(std::min<size_t>(a.frame.message_bytes, kMaxMessage));
    ReadExact(fd, a.message.data(), a.message.size(), "the node's answer");
    return a;
  } catch (const Error&) {
    return std::nullopt;
  }
}

// Throws the node's refusal, if the answer is one.
void ThrowIfRefused(const Answer& a, const std::string& where) {
  if (a.frame.status == 0) return;
  const uint32_t kind = a.frame.status - 1;
  const auto k = kind <= static_cast<uint32_t>(ErrorKind::kResourceExhausted)
                     ? static_cast<ErrorKind>(kind)
                     : ErrorKind::kUnavailable;
  throw Error(k, where + ": " + a.message);
}

}  // namespace

int64_t SendKvTransfer(node::SessionExporter& exporter, const std::string& host, int port,
                       const std::string& ticket, const ClientOptions& options) {
  const std::string where = host + ":" + std::to_string(port) + " (KV transfer)";
  if (ticket.size() != kTicketBytes) ThrowInvalidArgument(where + ": malformed ticket");
  const int fd = Connect(host, port, options.connect_timeout_s);
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  SetIoTimeout(fd, options.timeout_s);
  exporter.Rewind();
  try {
    std::string hello(kMagic, sizeof kMagic);
    hello += ticket;
    WriteAll(fd, hello.data(), hello.size(), "the ticket");
    node::ChunkMeta meta;
    std::vector<std::pair<const uint8_t*, size_t>> runs;
    std::vector<iovec> iov;
    Frame f;
    while (exporter.NextRuns(&meta, &runs)) {
      f = Frame{kChunkFrame,         meta.crc32c,      meta.index,
                meta.first_position, meta.n_positions, meta.bytes};
      iov.assign(1, iovec{&f, sizeof f});
      for (const auto& [p, n] : runs) iov.push_back({const_cast<uint8_t*>(p), n});
      WriteAll(fd, iov, "KV rows");
    }
    const node::ExportTrailer t = exporter.trailer();
    f = Frame{kTrailerFrame, t.session_digest, 0, 0, 0, t.total_bytes};
    WriteAll(fd, &f, sizeof f, "the trailer");
  } catch (const Error& e) {
    // A send failed: the node may have said why before it stopped reading.
    if (std::optional<Answer> a = ReadAnswer(fd)) ThrowIfRefused(*a, where);
    throw Error(e.kind(), where + ": " + e.what());
  }
  std::optional<Answer> a = ReadAnswer(fd);
  if (!a) throw Error(ErrorKind::kUnavailable, where + ": no answer from the node");
  ThrowIfRefused(*a, where);
  return exporter.trailer().total_bytes;
}

}  // namespace meshnet::rpc
