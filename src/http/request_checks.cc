#include "http/request_checks.h"

#include <httplib.h>
#include <strings.h>

#include <algorithm>
#include <cctype>

namespace meshnet::http {
namespace {

bool IsDecimal(const std::string& s) {
  return !s.empty() && s.size() <= 19 &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

bool ExpectsBody(const std::string& method) {
  return method == "POST" || method == "PUT" || method == "PATCH" || method == "DELETE";
}

Refusal Refuse(int status, std::string message, std::string code) {
  return Refusal{status, std::move(message), std::move(code)};
}

}  // namespace

const char* StatusReason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 400:
      return "Bad Request";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 431:
      return "Request Header Fields Too Large";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

size_t HeadEnd(std::string_view buffer) {
  // cpp-httplib ends a head at a line that is exactly CRLF after a line that
  // ended in LF.
  const size_t blank = buffer.find("\n\r\n");
  return blank == std::string_view::npos ? blank : blank + 3;
}

int HeaderCount(std::string_view head) {
  return std::max<int>(0, static_cast<int>(std::count(head.begin(), head.end(), '\n')) - 2);
}

std::optional<Refusal> CheckFraming(const httplib::Request& req, size_t max_body) {
  static const char* const kMethods[] = {"GET",    "HEAD",    "POST", "PUT",
                                         "DELETE", "OPTIONS", "PATCH"};
  if (std::none_of(std::begin(kMethods), std::end(kMethods),
                   [&](const char* m) { return req.method == m; })) {
    return Refuse(405, "the method " + req.method + " is not served", "method_not_allowed");
  }
  for (const auto& [name, value] : req.headers) {
    if (strcasecmp(name.c_str(), "Content-Encoding") == 0 &&
        strcasecmp(value.c_str(), "identity") != 0) {
      return Refuse(415, "request bodies must not be compressed (Content-Encoding: " + value + ")",
                    "unsupported_content_encoding");
    }
  }
  const bool chunked = req.has_header("Transfer-Encoding");
  if (chunked && (req.get_header_value_count("Transfer-Encoding") != 1 ||
                  strcasecmp(req.get_header_value("Transfer-Encoding").c_str(), "chunked") != 0)) {
    return Refuse(501, "only Transfer-Encoding: chunked is understood", "unsupported_framing");
  }
  if (!req.has_header("Content-Length")) return std::nullopt;
  if (chunked) {
    return Refuse(400, "a request has Content-Length or Transfer-Encoding, not both",
                  "bad_framing");
  }
  const std::string length = req.get_header_value("Content-Length");
  for (size_t i = 1; i < req.get_header_value_count("Content-Length"); ++i) {
    if (req.get_header_value("Content-Length", i) != length) {
      return Refuse(400, "conflicting Content-Length headers", "bad_framing");
    }
  }
  if (!IsDecimal(length)) return Refuse(400, "Content-Length is not a number", "bad_framing");
  if (std::stoull(length) > max_body) {
    return Refuse(413,
                  "the request body is larger than the limit of " + std::to_string(max_body) +
                      " bytes (--max-body)",
                  "request_too_large");
  }
  return std::nullopt;
}

void NormalizeRequest(httplib::Request& req) {
  if (ExpectsBody(req.method) && !req.has_header("Content-Length") &&
      !req.has_header("Transfer-Encoding")) {
    req.set_header("Content-Length", "0");
  }
  if (req.ranges.size() > 1 || (req.method != "GET" && req.method != "HEAD")) req.ranges.clear();
}

bool HasBody(const httplib::Request& req) {
  if (req.has_header("Transfer-Encoding")) return true;
  const std::string length = req.get_header_value("Content-Length");
  return !length.empty() && length != "0";
}

}  // namespace meshnet::http
