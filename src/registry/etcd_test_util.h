// Test helper: a real etcd (Debian's etcd-server) on 127.0.0.1 with a
// throwaway data dir. etcd cannot bind port 0, so free ports are found by
// binding port 0 first; a start that loses the race for them is retried with
// new ports. Startup is awaited by polling /health (bounded). The process is
// always killed and the data dir removed on destruction. Restart() keeps the
// ports and the data (leases survive, as in a real restart).
//
// With EtcdServerTls, the client URL is https (--cert-file, --key-file,
// --trusted-ca-file, --client-cert-auth); peers stay plain on loopback.
//
// Without an etcd binary the fixture fails the test, unless MESHNET_NO_ETCD is
// set in the environment (then it skips with that reason).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "util/die_with_parent.h"

namespace meshnet::registry::testing {

inline std::string FindEtcd() {
  for (const char* p : {"/usr/bin/etcd", "/usr/local/bin/etcd"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

// A port the OS calls free right now (bound to port 0, then closed).
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) close(fd);
    throw std::runtime_error("cannot bind a free port");
  }
  close(fd);
  return ntohs(a.sin_port);
}

// etcd's TLS files, and the client certificate its /health poll presents.
// The server certificate needs extendedKeyUsage clientAuth as well as
// serverAuth: etcd 3.4's JSON gateway dials etcd's own gRPC port with it.
struct EtcdServerTls {
  std::string ca_cert, server_cert, server_key, client_cert, client_key;
};

class EtcdServer {
 public:
  explicit EtcdServer(EtcdServerTls tls = {}) : tls_(std::move(tls)) {
    binary_ = FindEtcd();
    if (binary_.empty()) return;
    char tmpl[] = "/tmp/meshnet-etcd-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    for (int attempt = 0; attempt < 5; ++attempt) {
      client_port_ = FreePort();
      peer_port_ = FreePort();
      if (Launch()) return;
    }
    throw std::runtime_error("etcd did not start\n--- log ---\n" + Log());
  }
  ~EtcdServer() {
    Kill();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  bool available() const { return !binary_.empty(); }
  int port() const { return client_port_; }
  std::string url(const std::string& prefix = "/meshnet") const {
    return (tls() ? "etcds://127.0.0.1:" : "etcd://127.0.0.1:") + std::to_string(client_port_) +
           prefix;
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Kills etcd and starts it again on the same ports and data.
  void Restart() {
    Kill();
    for (int attempt = 0; attempt < 5; ++attempt) {
      if (Launch()) return;
    }
    throw std::runtime_error("etcd did not restart\n--- log ---\n" + Log());
  }
  // Turns etcd auth on with one user, root (every permission), whose
  // password is `password`. Throws if etcd refuses.
  void EnableAuth(const std::string& password) {
    const auto cli = HealthClient();
    const std::pair<const char*, std::string> steps[] = {
        {"/v3/auth/role/add", R"({"name":"root"})"},
        {"/v3/auth/user/add", R"({"name":"root","password":")" + password + R"("})"},
        {"/v3/auth/user/grant", R"({"user":"root","role":"root"})"},
        {"/v3/auth/enable", "{}"}};
    for (const auto& [path, body] : steps) {
      auto res = cli->Post(path, body, "application/json");
      if (!res || res->status != 200) throw std::runtime_error(std::string("etcd ") + path);
    }
  }
  std::string Log() const {
    std::ifstream in(dir_ + "/etcd.log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  // Starts etcd and waits up to 20 s for /health; false if it exited (a port
  // taken meanwhile) or never became healthy.
  bool tls() const { return !tls_.server_cert.empty(); }
  std::unique_ptr<httplib::ClientImpl> HealthClient() const {
    if (!tls()) return std::make_unique<httplib::ClientImpl>("127.0.0.1", client_port_);
    auto cli = std::make_unique<httplib::SSLClient>("127.0.0.1", client_port_, tls_.client_cert,
                                                    tls_.client_key);
    cli->set_ca_cert_path(tls_.ca_cert);
    return cli;
  }
  bool Launch() {
    const std::string client =
        (tls() ? "https://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(client_port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::vector<std::string> args = {binary_,
                                     "--name=meshnet-test",
                                     "--data-dir=" + dir_ + "/data",
                                     "--listen-client-urls=" + client,
                                     "--advertise-client-urls=" + client,
                                     "--listen-peer-urls=" + peer,
                                     "--initial-advertise-peer-urls=" + peer,
                                     "--initial-cluster=meshnet-test=" + peer,
                                     "--log-level=warn"};
    if (tls()) {
      for (std::string a :
           {"--cert-file=" + tls_.server_cert, "--key-file=" + tls_.server_key,
            "--trusted-ca-file=" + tls_.ca_cert, std::string("--client-cert-auth")}) {
        args.push_back(a);
      }
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = dir_ + "/etcd.log";
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      DieWithParent(parent);
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
      }
      execv(binary_.c_str(), argv.data());
      _exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      const auto cli = HealthClient();
      cli->set_connection_timeout(0, 200000);
      cli->set_read_timeout(1, 0);
      auto res = cli->Get("/health");
      if (res && res->status == 200 && res->body.find("\"true\"") != std::string::npos) {
        return true;
      }
      // Polling a starting process: there is nothing to block on.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    Kill();
    return false;
  }

  EtcdServerTls tls_;
  std::string binary_;
  std::string dir_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
};

// Skips (MESHNET_NO_ETCD set) or fails (etcd missing) a test without etcd.
#define MESHNET_REQUIRE_ETCD(server)                                                     \
  do {                                                                                   \
    if (!(server).available()) {                                                         \
      if (std::getenv("MESHNET_NO_ETCD") != nullptr) {                                   \
        GTEST_SKIP() << "MESHNET_NO_ETCD is set and etcd is not installed";              \
      }                                                                                  \
      FAIL() << "etcd is not installed (scripts/install-deps.sh installs etcd-server); " \
                "set MESHNET_NO_ETCD=1 to skip the etcd tests";                          \
    }                                                                                    \
  } while (0)

}  // namespace meshnet::registry::testing
