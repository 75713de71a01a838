// Canonical "host:port" spellings, so that one listener has one name.
//
// A node is named by the address it announces and signs (registry records,
// drain targets, challenge answers); two spellings of one socket must not pass
// for two nodes. CanonicalHostPort accepts
//   * an IPv4 literal in dotted decimal ("127.0.0.1:7001"), printed back by
//     inet_ntop;
//   * an IPv6 literal in brackets ("[::1]:7001"), printed back by inet_ntop in
//     its compressed lowercase form; an IPv4-mapped one ("[::ffff:127.0.0.1]")
//     becomes its IPv4 address;
//   * a DNS name of letters, digits, '-' and '.' (lowercased: "LOCALHOST" is
//     "localhost"); a name is not resolved, so "localhost:P" and
//     "127.0.0.1:P" stay two names, and a check that a node answers to the
//     name it was reached by tells them apart;
// with a decimal port 1..65535 (leading zeros dropped). Refused
// (Error(kInvalidArgument), naming why): no port, port 0, the unspecified
// addresses 0.0.0.0 and [::] (a socket bound there is reached by another
// name), gRPC target URIs ("ipv4:...", "dns:///..."), anything else.
//
// Thread-safety: pure function.
#pragma once

#include <sys/socket.h>

#include <string>
#include <string_view>

namespace meshnet {

std::string CanonicalHostPort(std::string_view address);

// A gRPC peer string without its port: "ipv4:10.0.0.7:5123" ->
// "ipv4:10.0.0.7", "ipv6:[::1]:5123" -> "ipv6:[::1]" (one caller, any port).
// Thread-safety: pure function.
std::string PeerHost(std::string_view peer);

// The unit a per-address limit counts as one client: an IPv4 address itself,
// an IPv6 address's /64 ("2001:db8:1:2::/64": an IPv6 client usually holds
// a whole /64). `ip` is a numeric address; an IPv4-mapped IPv6 address counts
// as its IPv4 address; anything else is returned unchanged.
// Thread-safety: pure function.
std::string AddressKey(std::string_view ip);

// AddressKey of a gRPC peer string: "ipv4:10.0.0.7:5123" -> "10.0.0.7",
// "ipv6:[2001:db8::1]:5123" -> "2001:db8::/64"; another peer ("unix:...")
// is its PeerHost.
// Thread-safety: pure function.
std::string PeerAddressKey(std::string_view peer);

// The numeric IP address of a socket address ("10.0.0.7", "2001:db8::1"),
// "?" for a family other than IPv4 and IPv6.
// Thread-safety: pure function.
std::string SocketIp(const sockaddr_storage& a);

// AddressKey of a socket address: what the caps on connections per client
// address of the KV transfer port and the registry's status page count.
// Thread-safety: pure function.
inline std::string SocketAddressKey(const sockaddr_storage& a) { return AddressKey(SocketIp(a)); }

}  // namespace meshnet
