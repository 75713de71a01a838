// The node-identity primitives: Ed25519 keys (generate, persist, sign,
// verify), HMAC, and canonical host:port spellings.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "util/error.h"
#include "util/host_port.h"
#include "util/secret.h"
#include "util/signing_key.h"

namespace meshnet {
namespace {

TEST(SigningKey, SignsAndVerifiesAndRefusesTampering) {
  const SigningKey key = SigningKey::Generate();
  ASSERT_EQ(key.public_key().size(), kPublicKeyBytes);
  const std::string sig = key.Sign("hello");
  ASSERT_EQ(sig.size(), kSignatureBytes);
  EXPECT_TRUE(VerifySignature(key.public_key(), "hello", sig));
  EXPECT_FALSE(VerifySignature(key.public_key(), "hellp", sig));
  std::string bad = sig;
  bad[5] ^= 1;
  EXPECT_FALSE(VerifySignature(key.public_key(), "hello", bad));
  const SigningKey other = SigningKey::Generate();
  EXPECT_NE(other.public_key(), key.public_key());
  EXPECT_FALSE(VerifySignature(other.public_key(), "hello", sig));
  EXPECT_FALSE(VerifySignature("short", "hello", sig));
  EXPECT_FALSE(VerifySignature(key.public_key(), "hello", sig.substr(1)));
}

TEST(SigningKey, PersistsAcrossLoadsWithPrivateMode) {
  char dir[] = "/tmp/meshnet-key-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/node.key";
  const SigningKey first = SigningKey::LoadOrCreate(path);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const SigningKey again = SigningKey::LoadOrCreate(path);
  EXPECT_EQ(again.public_key(), first.public_key());
  EXPECT_TRUE(VerifySignature(first.public_key(), "m", again.Sign("m")));
  { std::ofstream(std::string(dir) + "/junk.key") << "not a key"; }
  EXPECT_THROW(SigningKey::LoadOrCreate(std::string(dir) + "/junk.key"), Error);
  std::remove(path.c_str());
  std::remove((std::string(dir) + "/junk.key").c_str());
  rmdir(dir);
}

TEST(Hex, RoundTripsAndRefusesJunk) {
  EXPECT_EQ(ToHex(std::string("\x00\xab\xff", 3)), "00abff");
  EXPECT_EQ(FromHex("00abff"), std::string("\x00\xab\xff", 3));
  EXPECT_THROW(FromHex("abc"), Error);
  EXPECT_THROW(FromHex("zz"), Error);
}

TEST(Hmac, DependsOnKeyAndMessage) {
  const std::string a = HmacSha256("k", "m");
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(a, HmacSha256("k", "m"));
  EXPECT_NE(a, HmacSha256("k2", "m"));
  EXPECT_NE(a, HmacSha256("k", "m2"));
  // RFC 4231 test case 2.
  EXPECT_EQ(ToHex(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(CanonicalHostPort, OneSpellingPerSocket) {
  EXPECT_EQ(CanonicalHostPort("127.0.0.1:7001"), "127.0.0.1:7001");
  EXPECT_EQ(CanonicalHostPort("127.0.0.1:07001"), "127.0.0.1:7001");
  EXPECT_EQ(CanonicalHostPort("[::ffff:127.0.0.1]:7001"), "127.0.0.1:7001");
  EXPECT_EQ(CanonicalHostPort("[0:0:0:0:0:0:0:1]:7001"), "[::1]:7001");
  EXPECT_EQ(CanonicalHostPort("[::1]:7001"), "[::1]:7001");
  EXPECT_EQ(CanonicalHostPort("LOCALHOST:7001"), "localhost:7001");
  EXPECT_EQ(CanonicalHostPort("Node-3.example:9"), "node-3.example:9");
  for (const char* bad :
       {"0.0.0.0:7001", "[::]:7001", "ipv4:127.0.0.1:7001", "127.0.0.1", "127.0.0.1:0",
        "127.0.0.1:65536", "127.0.0.1:7a", ":7001", "dns:///a:1", "[::1:7001", "127.1:7001",
        "0127.0.0.1:7001", "a b:1", "[::ffff:0.0.0.0]:1"}) {
    EXPECT_THROW(CanonicalHostPort(bad), Error) << bad;
  }
}

// Per-address limits count an IPv4 address, or an IPv6 /64 (which one client
// usually holds whole), as one client, however gRPC spells the peer.
TEST(AddressKey, OneKeyPerIpv4AddressOrIpv6Slash64) {
  EXPECT_EQ(AddressKey("10.0.0.7"), "10.0.0.7");
  EXPECT_EQ(AddressKey("::ffff:10.0.0.7"), "10.0.0.7");
  EXPECT_EQ(AddressKey("2001:db8:1:2::1"), "2001:db8:1:2::/64");
  EXPECT_EQ(AddressKey("2001:db8:1:2:ffff:1:2:3"), "2001:db8:1:2::/64");
  EXPECT_NE(AddressKey("2001:db8:1:3::1"), AddressKey("2001:db8:1:2::1"));
  EXPECT_EQ(AddressKey("not an address"), "not an address");
  EXPECT_EQ(PeerAddressKey("ipv4:10.0.0.7:5123"), "10.0.0.7");
  EXPECT_NE(PeerAddressKey("ipv4:10.0.0.8:5123"), PeerAddressKey("ipv4:10.0.0.7:5123"));
  EXPECT_EQ(PeerAddressKey("ipv6:[2001:db8:1:2::9]:5123"), "2001:db8:1:2::/64");
  EXPECT_EQ(PeerAddressKey("ipv6:%5B2001:db8:1:2:a:b:c:d%5D:5123"), "2001:db8:1:2::/64");
  EXPECT_EQ(PeerAddressKey("ipv6:%5B::ffff:10.0.0.7%5D:5123"), "10.0.0.7");
  EXPECT_EQ(PeerAddressKey("ipv6:%5Bfe80::1%25eth0%5D:5123"), "fe80::/64");
  EXPECT_EQ(PeerAddressKey("unix:/tmp/s"), "unix");
}

// The raw-socket listeners (KV transfer port, registry status page) key their
// per-address caps the same way (were: the exact IPv6 address).
TEST(AddressKey, OfASocketAddress) {
  auto v6 = [](const char* ip) {
    sockaddr_storage a{};
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&a);
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(5123);
    EXPECT_EQ(inet_pton(AF_INET6, ip, &s6->sin6_addr), 1);
    return a;
  };
  sockaddr_storage v4{};
  auto* s4 = reinterpret_cast<sockaddr_in*>(&v4);
  s4->sin_family = AF_INET;
  s4->sin_port = htons(5123);
  ASSERT_EQ(inet_pton(AF_INET, "10.0.0.7", &s4->sin_addr), 1);
  EXPECT_EQ(SocketIp(v4), "10.0.0.7");
  EXPECT_EQ(SocketAddressKey(v4), "10.0.0.7");
  EXPECT_EQ(SocketIp(v6("2001:db8:1:2::9")), "2001:db8:1:2::9");
  EXPECT_EQ(SocketAddressKey(v6("2001:db8:1:2::9")), SocketAddressKey(v6("2001:db8:1:2:a:b:c:d")));
  EXPECT_NE(SocketAddressKey(v6("2001:db8:1:3::9")), SocketAddressKey(v6("2001:db8:1:2::9")));
  EXPECT_EQ(SocketAddressKey(v6("::ffff:10.0.0.7")), "10.0.0.7");
  sockaddr_storage unix_addr{};
  unix_addr.ss_family = AF_UNIX;
  EXPECT_EQ(SocketIp(unix_addr), "?");
}

}  // namespace
}  // namespace meshnet
