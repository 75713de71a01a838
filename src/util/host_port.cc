#include "util/host_port.h"

#include <arpa/inet.h>

#include <cctype>
#include <cstring>

#include "util/error.h"

namespace meshnet {

namespace {

[[noreturn]] void Refuse(std::string_view address, const std::string& why) {
  ThrowInvalidArgument("address '" + std::string(address.substr(0, 256)) + "': " + why);
}

std::string CanonicalPort(std::string_view address, std::string_view port) {
  if (port.empty() || port.size() > 8) Refuse(address, "expected host:port with a port 1..65535");
  long value = 0;
  for (const char c : port) {
    if (c < '0' || c > '9') Refuse(address, "the port must be decimal digits");
    value = value * 10 + (c - '0');
  }
  if (value < 1 || value > 65535) Refuse(address, "the port must be in 1..65535");
  return std::to_string(value);
}

std::string CanonicalV6(std::string_view address, const std::string& host) {
  in6_addr a6{};
  if (inet_pton(AF_INET6, host.c_str(), &a6) != 1) Refuse(address, "not an IPv6 address");
  if (IN6_IS_ADDR_UNSPECIFIED(&a6)) Refuse(address, "the unspecified address [::] names no host");
  char text[INET6_ADDRSTRLEN];
  if (IN6_IS_ADDR_V4MAPPED(&a6)) {
    in_addr a4{};
    std::memcpy(&a4, &a6.s6_addr[12], 4);
    if (a4.s_addr == 0) Refuse(address, "the unspecified address names no host");
    inet_ntop(AF_INET, &a4, text, sizeof text);
    return text;
  }
  inet_ntop(AF_INET6, &a6, text, sizeof text);
  return "[" + std::string(text) + "]";
}

bool LooksNumeric(const std::string& host) {
  for (const char c : host) {
    if (c != '.' && (c < '0' || c > '9')) return false;
  }
  return true;
}

std::string CanonicalName(std::string_view address, const std::string& host) {
  if (host.empty() || host.size() > 253) Refuse(address, "expected host:port");
  if (LooksNumeric(host)) {
    in_addr a4{};
    if (inet_pton(AF_INET, host.c_str(), &a4) != 1) {
      Refuse(address, "not an IPv4 address in dotted decimal");
    }
    if (a4.s_addr == 0) Refuse(address, "the unspecified address 0.0.0.0 names no host");
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &a4, text, sizeof text);
    return text;
  }
  std::string out;
  for (const char c : host) {
    const auto u = static_cast<unsigned char>(c);
    if (!std::isalnum(u) && c != '-' && c != '.') {
      Refuse(address, "a host name may hold only letters, digits, '-' and '.'");
    }
    out += static_cast<char>(std::tolower(u));
  }
  return out;
}

}  // namespace

std::string CanonicalHostPort(std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) Refuse(address, "expected host:port");
  const std::string port = CanonicalPort(address, address.substr(colon + 1));
  const std::string host(address.substr(0, colon));
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') Refuse(address, "unbalanced '[' in the host");
    return CanonicalV6(address, host.substr(1, host.size() - 2)) + ":" + port;
  }
  if (host.find(':') != std::string::npos) {
    Refuse(address, "expected host:port (an IPv6 host goes in brackets; no URI scheme)");
  }
  return CanonicalName(address, host) + ":" + port;
}

std::string PeerHost(std::string_view peer) {
  const size_t colon = peer.rfind(':');
  return std::string(colon == std::string_view::npos ? peer : peer.substr(0, colon));
}

std::string AddressKey(std::string_view ip) {
  const std::string text(ip);
  in_addr a4{};
  if (inet_pton(AF_INET, text.c_str(), &a4) == 1) return text;
  in6_addr a6{};
  if (inet_pton(AF_INET6, text.c_str(), &a6) != 1) return text;
  char out[INET6_ADDRSTRLEN] = "";
  if (IN6_IS_ADDR_V4MAPPED(&a6)) {
    std::memcpy(&a4, &a6.s6_addr[12], 4);
    inet_ntop(AF_INET, &a4, out, sizeof out);
    return out;
  }
  std::memset(a6.s6_addr + 8, 0, 8);
  inet_ntop(AF_INET6, &a6, out, sizeof out);
  return std::string(out) + "/64";
}

std::string PeerAddressKey(std::string_view peer) {
  const std::string host = PeerHost(peer);
  std::string_view ip = host;
  if (ip.rfind("ipv4:", 0) != 0 && ip.rfind("ipv6:", 0) != 0) return host;
  ip.remove_prefix(5);
  // gRPC writes the brackets of an IPv6 peer as they are or %-encoded.
  for (const std::string_view open : {"[", "%5B", "%5b"}) {
    if (ip.rfind(open, 0) == 0) ip.remove_prefix(open.size());
  }
  for (const std::string_view close : {"]", "%5D", "%5d"}) {
    if (ip.size() >= close.size() && ip.substr(ip.size() - close.size()) == close) {
      ip.remove_suffix(close.size());
    }
  }
  return AddressKey(ip.substr(0, ip.find('%')));  // without a zone ("%25eth0")
}

std::string SocketIp(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (a.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&a)->sin_addr, text, sizeof text);
  } else if (a.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr, text, sizeof text);
  }
  return text;
}

}  // namespace meshnet
