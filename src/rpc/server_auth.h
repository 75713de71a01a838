// The cluster-token check of a node, run on a call's initial metadata before
// gRPC reads its message.
//
// gRPC's synchronous (and callback) unary handlers are given a call only once
// its whole message has arrived, so a check inside the handler comes after
// the body was read: a tokenless 300 MB Step cost 300 MB or more (issue 8).
// A credentials' auth metadata processor runs in the server's auth filter on
// the initial metadata, before the call is matched to a handler or its
// message requested: a call it refuses is cancelled with the status it gives,
// and the transport never widens the stream's flow-control window for the
// body. Server interceptors do not help here: in the sync API they, too, run
// after the message has been received.
//
// gRPC 1.51's C++ InsecureServerCredentials() asserts on
// SetAuthMetadataProcessor, although the core's insecure credentials do carry
// a processor; PlaintextServerCredentials bridges to that core API.
//
// Thread-safety: TokenGate is immutable after construction (its reject hook
// must be thread-safe); the credentials are built before the server starts.
#pragma once

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "rpc/options.h"

namespace meshnet::rpc {

// Which credential a call needs, by its method (":path"):
//   * health checks and Prove: none (Prove is how a node is checked before
//     it is trusted with a token);
//   * Drain and Undrain: the admin token ("authorization: Bearer <admin>"),
//     never the cluster token; without an admin token they are refused;
//   * OfferImport and ImportSession: the cluster token, or a peer proof for
//     this node's key ("meshnet-peer-proof", rpc/prove.h: what a draining
//     node sends instead of its token);
//   * everything else: the cluster token.
// Tokens are compared as SHA-256 digests in constant time.
class TokenGate {
 public:
  // `token` empty: no cluster token required. `admin_token` empty: admin
  // calls refused. `public_key`: this node's key (peer proofs name it).
  // `on_reject` runs for each refusal.
  TokenGate(std::string_view token, std::string_view admin_token, std::string public_key,
            std::function<void()> on_reject);

  // `path` is the call's ":path" ("/grpc.health.v1.Health/Check").
  bool Admits(std::string_view path, std::string_view authorization,
              std::string_view peer_proof) const;
  // Admits(), calling on_reject when it does not.
  bool Check(std::string_view path, std::string_view authorization,
             std::string_view peer_proof) const;
  // The handlers' own check, behind the credentials' gate.
  bool Admits(std::string_view path, const grpc::ServerContextBase& ctx) const;
  const std::string& token_digest() const { return digest_; }

 private:
  std::string digest_;        // SHA-256 of "Bearer <token>"; empty: no token required
  std::string admin_digest_;  // SHA-256 of "Bearer <admin token>"; empty: admin refused
  std::string public_key_;
  std::function<void()> on_reject_;
};

// Whether a call's "authorization" metadata carries the token whose digest
// (SHA-256 of its BearerValue) is `digest`; true when `digest` is empty. The
// handlers' own check, behind the credentials' gate.
bool PresentsToken(const grpc::ServerContextBase& ctx, const std::string& digest);

// The node's listening credentials: TLS when `o` names a certificate (client
// certificates required when it names a CA), plaintext otherwise; with
// `gate` checking every call's metadata before its message is read. Throws
// Error(kInvalidArgument) for unreadable PEM.
std::shared_ptr<grpc::ServerCredentials> NodeServerCredentials(
    const NodeServerOptions& o, std::shared_ptr<const TokenGate> gate);

}  // namespace meshnet::rpc
