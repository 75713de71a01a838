// Test-only helpers for the rpc tests (header-only; never linked into the
// library): a scratch directory, a throwaway PKI made with the openssl CLI at
// test time (no key is ever committed), a tiny HTTP GET for /metrics, and
// (in tests built with MESHNET_SHIPPED_MODEL) node::ShippedFile().
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#ifdef MESHNET_SHIPPED_MODEL
#include "node/node_test_util.h"  // node::ShippedFile(): the shipped model, opened once
#endif

namespace meshnet::rpc::testing {

// A fresh directory under $TMPDIR, removed with its contents on destruction.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "meshnet-rpc-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

struct TestPki {
  std::string ca_cert, server_cert, server_key, client_cert, client_key;
  std::string other_ca_cert;  // an unrelated CA (its certs must be refused)
  std::string other_client_cert, other_client_key;
};

// Makes a CA, a server certificate for 127.0.0.1/localhost and a client
// certificate signed by it, plus an unrelated CA with its own client
// certificate. P-256 keys, valid for one day. Throws if openssl fails.
inline TestPki MakeTestPki(const ScratchDir& dir) {
  const std::string d = dir.path().string();
  std::ofstream(d + "/server.ext") << "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                   << "extendedKeyUsage=serverAuth\n";
  std::ofstream(d + "/client.ext") << "extendedKeyUsage=clientAuth\n";
  const std::string key = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  std::ostringstream sh;
  sh << "cd '" << d << "' && set -e && "
     << "openssl req -x509" << key
     << " -keyout ca.key -out ca.pem -days 1 -subj /CN=meshnet-test-ca && "
     << "openssl req -x509" << key
     << " -keyout other.key -out other.pem -days 1 -subj /CN=other-ca && "
     << "openssl req" << key << " -keyout server.key -out server.csr -subj /CN=localhost && "
     << "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 "
        "-extfile server.ext -out server.pem && "
     << "openssl req" << key << " -keyout client.key -out client.csr -subj /CN=meshnet-client && "
     << "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 "
        "-extfile client.ext -out client.pem && "
     << "openssl req" << key << " -keyout oclient.key -out oclient.csr -subj /CN=intruder && "
     << "openssl x509 -req -in oclient.csr -CA other.pem -CAkey other.key -CAcreateserial -days 1 "
        "-extfile client.ext -out oclient.pem"
     << " >/dev/null 2>&1";
  if (std::system(sh.str().c_str()) != 0) throw std::runtime_error("openssl failed: " + sh.str());
  return TestPki{d + "/ca.pem",     d + "/server.pem", d + "/server.key",  d + "/client.pem",
                 d + "/client.key", d + "/other.pem",  d + "/oclient.pem", d + "/oclient.key"};
}

// A TCP socket listening on 127.0.0.1 at a free port (into *port), with
// `backlog`. Throws std::runtime_error when it cannot.
inline int ListenOnLoopback(int backlog, int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      listen(fd, backlog) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) close(fd);
    throw std::runtime_error("cannot listen on 127.0.0.1");
  }
  *port = ntohs(a.sin_port);
  return fd;
}

// GET http://host:port/path over HTTP/1.0; returns the body ("" on failure).
inline std::string HttpGet(const std::string& host_port, const std::string& path) {
  const size_t colon = host_port.rfind(':');
  const std::string host = host_port.substr(0, colon);
  const int port = std::stoi(host_port.substr(colon + 1));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\n\r\n";
    if (send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

// The value of the first sample line starting with `series` ("name{labels}"),
// or -1 when absent.
inline double MetricValue(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

}  // namespace meshnet::rpc::testing
