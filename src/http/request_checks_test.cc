#include "http/request_checks.h"

#include <gtest/gtest.h>
#include <httplib.h>

namespace meshnet::http {
namespace {

httplib::Request Req(const std::string& method,
                     std::vector<std::pair<std::string, std::string>> headers) {
  httplib::Request r;
  r.method = method;
  for (auto& [k, v] : headers) r.headers.emplace(k, v);
  return r;
}

int Status(const std::optional<Refusal>& r) { return r ? r->status : 0; }

TEST(RequestChecks, HeadEndIsTheBlankLineHttplibStopsAt) {
  EXPECT_EQ(HeadEnd("GET / HTTP/1.1\r\nHost: x\r\n\r\nbody"), 27u);
  EXPECT_EQ(HeadEnd("GET / HTTP/1.1\r\n\r\n"), 18u);
  EXPECT_EQ(HeadEnd("GET / HTTP/1.1\nHost: x\n\r\n"), 25u);  // bare LF lines, then CRLF
  EXPECT_EQ(HeadEnd("GET / HTTP/1.1\r\nHost: x\r\n"), std::string_view::npos);
  EXPECT_EQ(HeadEnd("GET / HTTP/1.1\r\nHost: x\r\n\r"), std::string_view::npos);
  EXPECT_EQ(HeaderCount("GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\n\r\n"), 2);
  EXPECT_EQ(HeaderCount("GET / HTTP/1.1\r\n\r\n"), 0);
}

TEST(RequestChecks, FramingThatIsNotReadIsRefused) {
  const size_t max = 1000;
  EXPECT_EQ(Status(CheckFraming(Req("POST", {{"Content-Length", "1000"}}), max)), 0);
  EXPECT_EQ(Status(CheckFraming(Req("POST", {{"Content-Length", "1001"}}), max)), 413);
  EXPECT_EQ(Status(CheckFraming(Req("POST", {{"Content-Length", "99999999999999999999"}}), max)),
            400);
  EXPECT_EQ(Status(CheckFraming(Req("POST", {{"Content-Length", "-1"}}), max)), 400);
  EXPECT_EQ(Status(CheckFraming(Req("POST", {{"Content-Length", "12abc"}}), max)), 400);
  EXPECT_EQ(
      Status(CheckFraming(Req("POST", {{"Content-Length", "5"}, {"Content-Length", "6"}}), max)),
      400);
  EXPECT_EQ(Status(CheckFraming(Req("POST", {{"Transfer-Encoding", "chunked"}}), max)), 0);
  EXPECT_EQ(Status(CheckFraming(Req("POST", {{"Transfer-Encoding", "Chunked"}}), max)), 0);
  EXPECT_EQ(Status(CheckFraming(Req("POST", {{"Transfer-Encoding", "gzip, chunked"}}), max)), 501);
  EXPECT_EQ(Status(CheckFraming(
                Req("POST", {{"Transfer-Encoding", "chunked"}, {"Content-Length", "5"}}), max)),
            400);
  for (const char* enc : {"gzip", "deflate", "br", "x-gzip", "identity, gzip"}) {
    EXPECT_EQ(Status(CheckFraming(Req("POST", {{"Content-Encoding", enc}}), max)), 415) << enc;
  }
  EXPECT_EQ(Status(CheckFraming(Req("POST", {{"content-encoding", "IDENTITY"}}), max)), 0);
  EXPECT_EQ(Status(CheckFraming(Req("PRI", {}), max)), 405);
  EXPECT_EQ(Status(CheckFraming(Req("CONNECT", {}), max)), 405);
  EXPECT_EQ(Status(CheckFraming(Req("GET", {}), max)), 0);
}

TEST(RequestChecks, NormalizeKeepsOneRangeOfAGetAndGivesBodilessPostsALength) {
  httplib::Request get = Req("GET", {});
  get.ranges = {{0, 9}};
  NormalizeRequest(get);
  EXPECT_EQ(get.ranges.size(), 1u);
  get.ranges = {{0, -1}, {0, -1}, {0, -1}};
  NormalizeRequest(get);
  EXPECT_TRUE(get.ranges.empty());
  httplib::Request post = Req("POST", {});
  post.ranges = {{0, 9}};
  NormalizeRequest(post);
  EXPECT_TRUE(post.ranges.empty());
  EXPECT_EQ(post.get_header_value("Content-Length"), "0");
  EXPECT_FALSE(HasBody(post));
  httplib::Request chunked = Req("POST", {{"Transfer-Encoding", "chunked"}});
  NormalizeRequest(chunked);
  EXPECT_FALSE(chunked.has_header("Content-Length"));
  EXPECT_TRUE(HasBody(chunked));
}

}  // namespace
}  // namespace meshnet::http
