// An HTTP/1.1 server for untrusted clients: cpp-httplib parses requests,
// routes them and writes responses; meshnet owns the connections.
//
// Why not httplib's own loop (Debian 12's cpp-httplib 0.11): it gives each
// connection a pool thread from accept to close with only a per-read
// timeout, so a client sending one header line every few seconds holds a
// thread forever, and shutdown waits for it; it reads any number of
// headers; a chunked body is read whole (set_payload_max_length covers only
// Content-Length), a gzip or brotli body is expanded without limit, a POST
// without a length is read until the client closes; a client that
// half-closes after its request gets no answer (a FIN makes its writes
// fail); `Range` may name thousands of ranges, each a part of one reply
// built in memory. What httplib offers (a pre-routing handler, content
// readers, an Expect handler) runs only after the whole head was read. So:
//
//   * a poller thread (http/connection_hub.h) accepts, with a total and a
//     per-address connection cap, and reads each request head without
//     blocking, within --head-timeout and a size and header-count cap;
//     idle keep-alive connections wait there too. No thread is held until
//     a head is complete; then a worker runs httplib's process_request on
//     the connection (an httplib::Stream of ours);
//   * before any handler or credential check: framing checks (refusing
//     compressed bodies and unknown transfer codings, Content-Length over
//     the limit: 413), a body deadline and a byte cap on the wire;
//     handlers read bodies with ReadBody, which counts the payload exactly;
//   * one range or none; a body-bearing request without a length has none;
//   * the connection of a refused or failed request with a body closes
//     after its answer (the body was not read), with a lingering close;
//   * Stop closes every connection that is not in a handler at once, lets
//     handlers finish, and shuts the rest down at a hard deadline.
//
//   HardenedServer server(options);
//   server.Post("/x", [](const httplib::Request&, httplib::Response&, const httplib::ContentReader&
//   r) {...}); int port = server.Bind("127.0.0.1", 0);       // or "::1", "[::1]", "0.0.0.0"
//   std::thread t([&] { server.Serve(); });       // until Stop()
//
// Thread-safety: routes are registered before Serve; Stop from any thread.
// Handlers run on worker threads (several at once).
#pragma once

#include <httplib.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "http/connection.h"
#include "http/connection_hub.h"
#include "http/tls_context.h"
#include "util/mutex.h"

namespace meshnet::http {

struct HardenedOptions {
  ConnectionLimits connection;
  HubLimits hub;
  int worker_threads = 16;  // requests served at once
  size_t keep_alive_max_requests = 1000;
  std::string tls_cert;  // both set: HTTPS
  std::string tls_key;
  // The body of the server's own refusals (431, 408, 413, 415, 503, ...);
  // default: the message as text/plain.
  RefusalBody refusal_body;
};

class HardenedServer : private httplib::Server {
 public:
  // Throws Error(kInvalidArgument) for unreadable or invalid TLS files.
  explicit HardenedServer(HardenedOptions options);
  ~HardenedServer() override;

  using Handler = httplib::Server::Handler;
  using HandlerWithContentReader = httplib::Server::HandlerWithContentReader;

  // Routes, registered before Serve. A method with a body takes a content
  // reader handler only (it reads the body itself, e.g. with ReadBody, after
  // its own checks); a path without one gets 404 and its body is not read.
  void Get(const std::string& pattern, Handler handler);
  void Options(const std::string& pattern, Handler handler);
  void Post(const std::string& pattern, HandlerWithContentReader handler);
  void Put(const std::string& pattern, HandlerWithContentReader handler);
  void Patch(const std::string& pattern, HandlerWithContentReader handler);
  void Delete(const std::string& pattern, HandlerWithContentReader handler);

  // Called for every response of status >= 400 that is not one of the
  // server's own refusals (e.g. httplib's 404 for an unknown path).
  void SetErrorHandler(Handler handler);

  // Binds host:port (port 0: a free one; an IPv6 host with or without
  // brackets) and returns the port. Throws Error(kUnavailable).
  int Bind(const std::string& host, int port);
  // Serves until Stop(); returns once every connection is closed.
  void Serve();
  // Stops accepting and closes every connection not in a handler; handlers
  // finish (their connections then close); at `hard_deadline` the
  // connections still open are shut down.
  void Stop(Clock::time_point hard_deadline = Clock::time_point::max());
  // Connections open now (waiting or in handlers).
  int open_connections() const;

 private:
  void ServeConnection(Connection& conn, bool* keep);
  void AddCatchAlls();
  void WorkerLoop();
  void InstallGuards();

  HardenedOptions options_;
  std::unique_ptr<TlsContext> tls_;
  Handler user_error_;
  int listen_fd_ = -1;
  std::unique_ptr<ConnectionHub> hub_;
  std::atomic<bool> stop_requested_{false};
  Mutex stop_mu_;
  Clock::time_point stop_deadline_ GUARDED_BY(stop_mu_) = Clock::time_point::max();
};

// The connection of the request the calling thread serves (nullptr outside
// a handler of a HardenedServer).
Connection* CurrentConnection();

// Reads the request body through `reader` into `out`, at most `max_bytes` of
// payload (after chunked framing). nullopt when it was read whole; else the
// refusal (413 over the limit or the wire cap, 408 too slow, 400 malformed
// framing), which also closes the connection after the answer.
std::optional<Refusal> ReadBody(const httplib::ContentReader& reader, size_t max_bytes,
                                std::string* out);

}  // namespace meshnet::http
