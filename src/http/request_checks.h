// The checks a hardened HTTP/1.1 server makes on a request before any
// handler, body read or credential check: the head's size and header count,
// the body's framing (Content-Length, Transfer-Encoding, Content-Encoding,
// method) against the body limit, and what cpp-httplib is then handed (no
// multi-range requests, no read-until-close bodies).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace httplib {
struct Request;
}

namespace meshnet::http {

// A request refused by the server itself: its status, a sentence for the
// client and a machine-readable code.
struct Refusal {
  int status = 400;
  std::string message;
  std::string code;
};

// "Request Header Fields Too Large" for 431, ... ("Error" when unknown).
const char* StatusReason(int status);

// Where a request head that starts at buffer[0] ends (the bytes after it are
// its body or the next request): the offset just past the blank line, or
// npos while the head is incomplete.
size_t HeadEnd(std::string_view buffer);

// The number of header lines of a complete head (request line and the blank
// line not counted).
int HeaderCount(std::string_view head);

// Refuses what the server does not read: a method with no handlers (405), a
// Content-Encoding other than identity (415; compressed bodies would expand
// without bound), a Transfer-Encoding other than chunked (501), both
// Transfer-Encoding and Content-Length, or a Content-Length that is not one
// decimal number (400), a Content-Length over `max_body` (413).
std::optional<Refusal> CheckFraming(const httplib::Request& req, size_t max_body);

// Makes a request safe for cpp-httplib once its head is parsed: a body-bearing
// method with neither Content-Length nor Transfer-Encoding gets
// Content-Length: 0 (httplib would read it until the client closes), and
// Range is honoured only as one range of a GET or HEAD (several ranges made
// one multipart reply per range, built in memory).
void NormalizeRequest(httplib::Request& req);

// Whether the request announced a body (a Content-Length above 0 or
// Transfer-Encoding).
bool HasBody(const httplib::Request& req);

}  // namespace meshnet::http
