#include "api/connection_watch.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace meshnet::api {

namespace {

// Numeric host and port of an IPv4/IPv6 socket address (as cpp-httplib
// reports them); false for any other family (a Unix socket of the parent).
bool HostPort(const sockaddr_storage& addr, socklen_t len, std::string* host, int* port) {
  if (addr.ss_family == AF_INET) {
    *port = ntohs(reinterpret_cast<const sockaddr_in&>(addr).sin_port);
  } else if (addr.ss_family == AF_INET6) {
    *port = ntohs(reinterpret_cast<const sockaddr_in6&>(addr).sin6_port);
  } else {
    return false;
  }
  char h[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, h, sizeof h, nullptr, 0,
                  NI_NUMERICHOST) != 0) {
    return false;
  }
  *host = h;
  return true;
}

// Whether `fd` is the TCP connection local_port <-> remote_addr:remote_port.
bool IsConnection(int fd, const httplib::Request& req) {
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof local, peer_len = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;
  std::string local_host, peer_host;
  int local_port = -1, peer_port = -1;
  return HostPort(local, local_len, &local_host, &local_port) &&
         HostPort(peer, peer_len, &peer_host, &peer_port) && local_port == req.local_port &&
         peer_port == req.remote_port && peer_host == req.remote_addr;
}

}  // namespace

ConnectionWatch::ConnectionWatch(const httplib::Request& req) {
  if (req.remote_port < 0 || req.local_port < 0) return;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    if (IsConnection(fd, req)) {
      fd_ = fd;
      return;
    }
  }
}

bool ConnectionWatch::Gone() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace meshnet::api
