// One accepted HTTP connection of the hardened server (http/hardened_server.h):
// a non-blocking socket, optionally TLS, with the bytes read but not yet
// consumed. It lives in two places in turn:
//
//   * the poller (one thread for every connection that is not in a handler)
//     drives it without blocking: the TLS handshake, the request head until
//     it is complete, and a lingering close; each stage has a deadline
//     (idle wait for a request, head, linger) and the head has a size and
//     header-count cap, so a slow or oversized client holds no thread;
//   * a worker then serves one request on it through cpp-httplib, which
//     reads and writes it as an httplib::Stream: reads come from the
//     buffered head first, the body has a deadline and a byte cap, and
//     writes fail after write_timeout_s without progress.
//
// Thread-safety: one thread at a time drives a connection (the poller or
// the worker that took it); ShutdownNow may be called from any thread.
#pragma once

#include <httplib.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "http/request_checks.h"

typedef struct ssl_st SSL;

namespace meshnet::http {

using Clock = std::chrono::steady_clock;

struct ConnectionLimits {
  double idle_timeout_s = 5;   // for the first byte of a request (keep-alive wait)
  double head_timeout_s = 10;  // for the rest of the head after its first byte; a TLS handshake too
  double body_timeout_s = 60;  // for the whole body after the head
  double write_timeout_s = 5;  // a write that makes no progress this long fails
  double linger_s = 2;         // reading what a refused client still sends before closing
  size_t max_head_bytes = 64 << 10;
  int max_header_count = 128;
  size_t max_body_bytes = 1 << 20;  // payload; the bytes on the wire get framing room on top
};

// The content type and body of the answer to a Refusal.
using RefusalBody = std::function<std::pair<std::string, std::string>(const Refusal&)>;

class Connection final : public httplib::Stream {
 public:
  enum class Stage { kHandshake, kHead, kRequest, kBody, kLinger };
  enum class Step { kWaiting, kReady, kClosed };

  // Takes ownership of `fd` (non-blocking, accepted) and `ssl` (may be null).
  Connection(int fd, SSL* ssl, const ConnectionLimits& limits);
  ~Connection() override;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const std::string& peer_ip() const { return peer_ip_; }
  // The per-address cap's key: the IPv4 address, or an IPv6 address's /64.
  const std::string& peer_key() const { return peer_key_; }
  Stage stage() const { return stage_; }

  // ---- The poller's side: never blocks.
  // Moves the connection on with what has arrived: kReady once a whole
  // request head is buffered (hand it to a worker), kClosed when it should be
  // destroyed; a refused head gets its answer (`render`) and lingers.
  Step Advance(const RefusalBody& render);
  // The stage's deadline passed: closes an idle wait, answers an unfinished
  // head with 408 and lingers, ends a linger. Returns kClosed or kWaiting.
  Step Expire(const RefusalBody& render);
  Clock::time_point deadline() const { return deadline_; }
  short poll_events() const { return want_write_ ? POLLOUT : POLLIN; }
  // Answers `refusal` with a best-effort non-blocking write, then lingers.
  void RefuseAndLinger(const Refusal& refusal, const RefusalBody& render);
  // Closes the sending side and reads (and drops) what the client still
  // sends for up to linger_s, so that a client still writing a refused body
  // reads the answer instead of a reset.
  void Linger();
  // Back from a worker, keeping the connection open for the next request.
  void AwaitNextRequest();

  // ---- The worker's side.
  void BeginRequest() {
    stage_ = Stage::kRequest;
    ++requests_;
  }
  // Requests begun on this connection.
  size_t requests_served() const { return requests_; }
  // The head is parsed: the body (if any) must arrive by body_timeout_s.
  void BeginBody(bool http10, bool has_body);
  bool has_body() const { return has_body_; }
  // A refusal decided while serving (a framing check, a body over the cap or
  // too slow); the answer is rendered by the server's error handler.
  void SetRefusal(Refusal r) {
    refusal_ = std::move(r);
    close_after_ = true;
  }
  const std::optional<Refusal>& refusal() const { return refusal_; }
  void CloseAfterResponse() { close_after_ = true; }
  bool close_after() const { return close_after_; }
  // True once the client has reset the connection, or closed it for good. A
  // FIN alone is a client that may still read (nc -N): the first time one is
  // seen an interim "100 Continue" goes out (HTTP/1.1), which a closed socket
  // answers with a reset. An HTTP/1.0 client's FIN means gone.
  bool ClientGone();
  // Any thread: makes every pending and future read and write fail at once.
  void ShutdownNow();

  // httplib::Stream, for the worker.
  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return fd_; }

 private:
  // > 0: bytes; 0: the peer ended the stream; -1: would block (want_write_
  // says for what); -2: an error.
  ssize_t RawRead(char* p, size_t n);
  ssize_t RawWrite(const char* p, size_t n);
  enum class Wait { kReady, kTimeout, kError };
  // Waits until the socket is ready for want_write_'s event, or `until`.
  Wait WaitReady(Clock::time_point until);
  // Blocking read of more bytes into in_ (the worker's reads); the result of
  // the last RawRead that ended it.
  ssize_t Fill();
  Step HandshakeStep();
  Step HeadStep(const RefusalBody& render);
  Step LingerStep();
  void Compact();

  int fd_;
  SSL* ssl_;
  const ConnectionLimits limits_;
  std::string peer_ip_, peer_key_, local_ip_;
  int peer_port_ = -1, local_port_ = -1;
  Stage stage_;
  Clock::time_point deadline_;
  bool want_write_ = false;
  std::string in_;  // read, not consumed from in_off_ on
  size_t in_off_ = 0;
  bool head_started_ = false;
  size_t lingered_ = 0;
  size_t requests_ = 0;
  size_t body_wire_ = 0;
  bool has_body_ = false;
  bool http10_ = false;
  bool probed_ = false;
  bool close_after_ = false;
  std::optional<Refusal> refusal_;
  std::atomic<bool> shut_{false};
};

}  // namespace meshnet::http
