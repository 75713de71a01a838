// Test helper (header-only, tests only): hostile HTTP clients for the
// hardened server and front-door tests. RawHttp is one
// TCP connection (IPv4 or IPv6, plain or TLS through OpenSSL without
// certificate checks) whose bytes, pauses and half-close the test controls;
// every read is bounded by a deadline. ProcStatus reads a child's peak RSS
// and thread count from /proc.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <fstream>
#include <string>

namespace meshnet::http::testing {

// "HOST:PORT" or "[V6]:PORT" -> host (no brackets) and port.
inline bool SplitHostPort(const std::string& addr, std::string* host, std::string* port) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos) return false;
  *host = addr.substr(0, colon);
  *port = addr.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return true;
}

// Whether this machine can listen on and connect to [::1].
inline bool Ipv6LoopbackWorks() {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

class RawHttp {
 public:
  // `rcvbuf` > 0 shrinks the receive buffer (a client that reads slowly).
  RawHttp(const std::string& addr, bool tls, int rcvbuf = 0) {
    std::string host, port;
    if (!SplitHostPort(addr, &host, &port)) return;
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return;
    fd_ = socket(res->ai_family, SOCK_STREAM, 0);
    if (rcvbuf > 0) setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    const int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    timeval tv{20, 0};  // bounds every blocking read and write
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    ok_ = connect(fd_, res->ai_addr, res->ai_addrlen) == 0;
    freeaddrinfo(res);
    if (ok_ && tls) ok_ = StartTls();
  }
  ~RawHttp() { Close(); }
  RawHttp(const RawHttp&) = delete;
  RawHttp& operator=(const RawHttp&) = delete;

  bool ok() const { return ok_; }
  int fd() const { return fd_; }

  // Writes all of `s`; false once the server has closed or reset.
  bool Send(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ssl_ != nullptr
                            ? SSL_write(ssl_, s.data() + off, static_cast<int>(s.size() - off))
                            : send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // nc -N: the request is sent, the client's write side is closed, its read
  // side stays open (TLS: close_notify, then FIN).
  void HalfClose() {
    if (ssl_ != nullptr) SSL_shutdown(ssl_);
    shutdown(fd_, SHUT_WR);
  }
  // Reads until the peer closes, `stop_at` appears, `max` bytes, or
  // `seconds` pass; returns what arrived.
  std::string Read(double seconds, const std::string& stop_at = "", size_t max = 64 << 20) {
    std::string got;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    char buf[16384];
    const int flags = fcntl(fd_, F_GETFL);
    fcntl(fd_, F_SETFL, flags | O_NONBLOCK);  // TLS records that are not data must not block
    while (got.size() < max) {
      if (!stop_at.empty() && got.find(stop_at) != std::string::npos) break;
      const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                            deadline - std::chrono::steady_clock::now())
                                            .count());
      if (left <= 0) break;
      const ssize_t n =
          ssl_ != nullptr ? SSL_read(ssl_, buf, sizeof buf) : read(fd_, buf, sizeof buf);
      if (n > 0) {
        got.append(buf, static_cast<size_t>(n));
        continue;
      }
      const bool again = ssl_ != nullptr
                             ? SSL_get_error(ssl_, static_cast<int>(n)) == SSL_ERROR_WANT_READ
                             : n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
      if (!again) {
        closed_ = true;
        break;
      }
      pollfd p{fd_, POLLIN, 0};
      poll(&p, 1, left);
    }
    fcntl(fd_, F_SETFL, flags);
    return got;
  }
  // Whether the server has sent something to read (or closed): for TLS,
  // application data only, not the session tickets TLS 1.3 servers send
  // after the handshake. Does not block.
  bool HasData() {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return false;
    if (ssl_ == nullptr) return true;
    const int flags = fcntl(fd_, F_GETFL);
    fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
    char c;
    const int n = SSL_peek(ssl_, &c, 1);
    const int err = SSL_get_error(ssl_, n);
    fcntl(fd_, F_SETFL, flags);
    return n > 0 || (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE);
  }
  // True once a Read saw the server close (or reset) the connection.
  bool closed() const { return closed_; }
  void Close() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (ctx_ != nullptr) SSL_CTX_free(ctx_);
    ssl_ = nullptr;
    ctx_ = nullptr;
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  bool StartTls() {
    // SSL_write writes with write(2): a server that closed must not kill the
    // test with SIGPIPE.
    std::signal(SIGPIPE, SIG_IGN);
    ctx_ = SSL_CTX_new(TLS_client_method());
    if (ctx_ == nullptr) return false;
    SSL_CTX_set_verify(ctx_, SSL_VERIFY_NONE, nullptr);  // the test's own throwaway certificate
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, fd_);
    return SSL_connect(ssl_) == 1;
  }

  int fd_ = -1;
  bool ok_ = false;
  bool closed_ = false;
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
};

// The HTTP status of a response ("HTTP/1.1 413 ..." -> 413), 0 when none.
// Interim 1xx responses before the final one are skipped.
inline int StatusOf(const std::string& response) {
  size_t at = 0;
  while (response.compare(at, 5, "HTTP/") == 0) {
    const size_t sp = response.find(' ', at);
    if (sp == std::string::npos) return 0;
    const int status = std::atoi(response.c_str() + sp + 1);
    if (status >= 200 || status < 100) return status;
    const size_t end = response.find("\r\n\r\n", at);
    if (end == std::string::npos) return status;
    at = end + 4;
  }
  return 0;
}

// The body of the final response (after any 1xx), "" if none.
inline std::string BodyOf(const std::string& response) {
  size_t at = 0;
  while (true) {
    const size_t end = response.find("\r\n\r\n", at);
    if (end == std::string::npos) return "";
    const bool interim = response.compare(at, 10, "HTTP/1.1 1") == 0;
    if (!interim) return response.substr(end + 4);
    at = end + 4;
  }
}

// VmHWM (peak resident set, KiB) and Threads of process `pid`.
struct ProcStatus {
  int64_t vm_hwm_kib = -1;
  int64_t threads = -1;
};

inline ProcStatus ReadProcStatus(int pid) {
  ProcStatus s;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (in >> key) {
    if (key == "VmHWM:") in >> s.vm_hwm_kib;
    if (key == "Threads:") in >> s.threads;
    std::string rest;
    std::getline(in, rest);
  }
  return s;
}

// A request with a JSON body and the bearer key (empty: none).
inline std::string PostRequest(const std::string& path, const std::string& body,
                               const std::string& key, const std::string& extra_headers = "") {
  std::string r = "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
  if (!key.empty()) r += "Authorization: Bearer " + key + "\r\n";
  return r + extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

inline std::string GetRequest(const std::string& path, const std::string& key = "",
                              const std::string& extra_headers = "") {
  std::string r = "GET " + path + " HTTP/1.1\r\nHost: x\r\n";
  if (!key.empty()) r += "Authorization: Bearer " + key + "\r\n";
  return r + extra_headers + "\r\n";
}

}  // namespace meshnet::http::testing
