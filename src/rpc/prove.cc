#include "rpc/prove.h"

#include <cstdlib>

#include "rpc/auth.h"
#include "rpc/channel.h"
#include "rpc/codec.h"
#include "rpc/status.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/host_port.h"
#include "util/secret.h"
#include "util/signing_key.h"

namespace meshnet::rpc {

namespace {

constexpr size_t kChallengeBytes = 32;
constexpr int64_t kPeerProofWindowMs = 120000;

std::string PeerProofMac(std::string_view token_digest, std::string_view target_key,
                         const std::string& ms) {
  return HmacSha256(token_digest, "meshnet-peer-v1\n" + std::string(target_key) + "\n" + ms);
}

[[noreturn]] void Refuse(const std::string& address, const std::string& why) {
  throw Error(ErrorKind::kPermissionDenied, address + " failed its proof: " + why);
}

}  // namespace

std::string ProveSignedText(std::string_view challenge, const pb::InfoResponse& i) {
  return "meshnet-prove-v1\n" + std::string(challenge) + "\n" + i.address() + "\n" +
         i.public_key() + "\n" + i.model_id() + "\n" + std::to_string(i.start_layer()) + "-" +
         std::to_string(i.end_layer()) + "/" + std::to_string(i.total_layers()) + "\n" +
         i.recipe_fingerprint() + "\n" + i.instance_id();
}

std::string MemberProof(std::string_view token_digest, std::string_view challenge,
                        std::string_view public_key) {
  return HmacSha256(token_digest, "meshnet-member-v1\n" + std::string(challenge) + "\n" +
                                      std::string(public_key));
}

ProvenNode ProveOn(pb::MeshNode::Stub& stub, const std::string& address,
                   const ClientOptions& options, const std::string& expected_key) {
  const std::string canonical = CanonicalHostPort(address);
  std::string challenge = RandomBytes16() + RandomBytes16();
  challenge.resize(kChallengeBytes);
  pb::ProveRequest req;
  req.set_challenge(challenge);
  grpc::ClientContext ctx;  // no token: the node proves itself before it is trusted
  ctx.set_deadline(DeadlineAfter(options.info_timeout_s));
  pb::ProveResponse resp;
  const grpc::Status s = stub.Prove(&ctx, req, &resp);
  if (!s.ok()) ThrowForStatus(s, ctx, address, "Prove");
  const pb::InfoResponse& info = resp.info();
  if (!VerifySignature(info.public_key(), ProveSignedText(challenge, info), resp.signature())) {
    Refuse(address, "no valid signature of the challenge by the key it names");
  }
  if (!expected_key.empty() && info.public_key() != expected_key) {
    Refuse(address, "its key " + ToHex(info.public_key()).substr(0, 16) +
                        " is not the one expected (" + ToHex(expected_key).substr(0, 16) + ")");
  }
  if (info.address() != canonical) {
    Refuse(address, "it answers as '" + info.address() + "', not as " + canonical);
  }
  if (!options.auth_token.empty()) {
    const std::string want =
        MemberProof(SecretDigest(BearerValue(options.auth_token)), challenge, info.public_key());
    if (!DigestEquals(want, resp.member_proof())) {
      Refuse(address, "it does not know this cluster's token");
    }
  }
  ProvenNode out;
  static_cast<node::NodeInfo&>(out.info) = DecodeNodeInfo(info);
  out.info.protocol_version = info.protocol_version();
  out.address = canonical;
  out.public_key = info.public_key();
  return out;
}

ProvenNode ProveNode(const std::string& address, const ClientOptions& options,
                     const std::string& expected_key) {
  auto stub = pb::MeshNode::NewStub(MakeClientChannel(address, options));
  return ProveOn(*stub, address, options, expected_key);
}

std::string PeerProof(std::string_view token, std::string_view target_key) {
  if (token.empty()) return "";
  const std::string ms = std::to_string(UnixMillis());
  return ms + ":" + ToHex(PeerProofMac(SecretDigest(BearerValue(token)), target_key, ms));
}

bool PeerProofValid(std::string_view token_digest, std::string_view own_key,
                    std::string_view value) {
  const size_t colon = value.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon > 19) return false;
  const std::string ms(value.substr(0, colon));
  for (const char c : ms) {
    if (c < '0' || c > '9') return false;
  }
  if (std::llabs(UnixMillis() - std::strtoll(ms.c_str(), nullptr, 10)) > kPeerProofWindowMs) {
    return false;
  }
  std::string mac;
  try {
    mac = FromHex(value.substr(colon + 1));
  } catch (const Error&) {
    return false;
  }
  return DigestEquals(mac, PeerProofMac(token_digest, own_key, ms));
}

}  // namespace meshnet::rpc
