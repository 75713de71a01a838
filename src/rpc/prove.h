// Proving a node's identity (MeshNode.Prove) and a peer's cluster
// membership, without sending any secret to a host that is not yet trusted.
//
// A node holds an Ed25519 key (util/signing_key.h). Prove answers a caller's
// fresh random challenge with the node's Info, the canonical address it
// announces, its public key, a signature over all of them and the challenge
// (ProveSignedText), and, when the node has a cluster token, a member proof:
// an HMAC of the challenge and key under the token's digest. A host that only
// replays a real node's answers cannot sign a new challenge; a host that
// relays the challenge to the real node gets a signature naming the real
// node's address, not its own; a host without the token cannot make the
// member proof. ProveNode checks all of that and is open to every caller: the
// node's token is checked by the node's answer, never sent to it.
//
// Pushing a session (drain) to a proven node carries a peer proof instead of
// the cluster token: an HMAC, under the token's digest, of the target's
// public key and the time, which only that target can check and which is
// worthless to anyone else (PeerProof, PeerProofValid).
//
// Internal to rpc/ (takes gRPC types). Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "proto/meshnet.grpc.pb.h"
#include "rpc/options.h"
#include "rpc/remote.h"

namespace meshnet::rpc {

namespace pb = ::meshnet::v1;

inline constexpr char kPeerProofMetadata[] = "meshnet-peer-proof";

// A node that passed ProveNode: its Info, its canonical address and key.
struct ProvenNode {
  NodeInfo info;
  std::string address;
  std::string public_key;  // 32 raw bytes
};

// What Prove signs and what a member proof is made of (see the proto).
std::string ProveSignedText(std::string_view challenge, const pb::InfoResponse& info);
std::string MemberProof(std::string_view token_digest, std::string_view challenge,
                        std::string_view public_key);

// Calls Prove on `stub` (no token sent) with a fresh challenge and checks the
// answer: a valid signature by the key it names; that key == `expected_key`
// when one is given; the signed address == CanonicalHostPort(`address`); and
// with options.auth_token, a member proof for that token. Throws
// Error(kPermissionDenied) naming what failed, kUnavailable when the node
// cannot be reached within options.info_timeout_s.
ProvenNode ProveOn(pb::MeshNode::Stub& stub, const std::string& address,
                   const ClientOptions& options, const std::string& expected_key = "");
// The same over a channel of its own.
ProvenNode ProveNode(const std::string& address, const ClientOptions& options,
                     const std::string& expected_key = "");

// The "meshnet-peer-proof" value for a call to the node whose key is
// `target_key`, from a peer holding `token` ("" without a token).
std::string PeerProof(std::string_view token, std::string_view target_key);
// Whether `value` is a peer proof for `own_key` under the token whose digest
// (SHA-256 of its BearerValue) is `token_digest`, made within 120 s of now.
bool PeerProofValid(std::string_view token_digest, std::string_view own_key,
                    std::string_view value);

}  // namespace meshnet::rpc
