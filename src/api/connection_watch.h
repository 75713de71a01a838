// Whether the HTTP client of a request has hung up, for handlers that write
// nothing until they are done (a non-streamed completion).
//
// cpp-httplib 0.11 (Debian 12) gives a handler no access to its connection:
// a streamed response learns of a hang-up from a failing write, a plain one
// only when it finally answers. The connection is the process's socket whose
// local and peer ports are the request's (the worker thread keeps it open
// while the handler runs, so the descriptor cannot be reused meanwhile);
// ConnectionWatch finds it once and then polls it for the peer's FIN or a
// reset (POLLRDHUP/POLLHUP/POLLERR), without reading from it.
//
// Thread-safety: one watch per handler call; Gone() from that thread.
#pragma once

#include <httplib.h>

namespace meshnet::api {

class ConnectionWatch {
 public:
  explicit ConnectionWatch(const httplib::Request& req);
  // True once the client has closed or reset the connection. Always false
  // when the socket was not found (the request then runs to its end).
  bool Gone() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace meshnet::api
