#include "rpc/server_auth.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpcpp/security/auth_metadata_processor.h>

#include <utility>

#include "rpc/auth.h"
#include "rpc/prove.h"
#include "util/secret.h"

namespace meshnet::rpc {

namespace {

constexpr std::string_view kHealthPrefix = "/grpc.health.v1.Health/";
constexpr std::string_view kProve = "/meshnet.v1.MeshNode/Prove";
constexpr std::string_view kDrain = "/meshnet.v1.MeshNode/Drain";
constexpr std::string_view kUndrain = "/meshnet.v1.MeshNode/Undrain";
constexpr std::string_view kOfferImport = "/meshnet.v1.MeshNode/OfferImport";
constexpr std::string_view kImportSession = "/meshnet.v1.MeshNode/ImportSession";
constexpr char kRefused[] = "missing or wrong cluster token (admin calls: the admin token)";

std::string_view View(const grpc_slice& s) {
  return {reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)), GRPC_SLICE_LENGTH(s)};
}

// The gate as a C++ processor, for the TLS credentials (which support one).
class GateProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit GateProcessor(std::shared_ptr<const TokenGate> gate) : gate_(std::move(gate)) {}
  // A digest comparison: cheap, so it runs inline on the transport's thread.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& md, grpc::AuthContext*, OutputMetadata*,
                       OutputMetadata*) override {
    std::string_view path, authorization, proof;
    for (const auto& [key, value] : md) {
      const std::string_view k(key.data(), key.size());
      if (k == ":path") path = std::string_view(value.data(), value.size());
      if (k == "authorization") authorization = std::string_view(value.data(), value.size());
      if (k == kPeerProofMetadata) proof = std::string_view(value.data(), value.size());
    }
    return gate_->Check(path, authorization, proof)
               ? grpc::Status::OK
               : grpc::Status(grpc::StatusCode::UNAUTHENTICATED, kRefused);
  }

 private:
  std::shared_ptr<const TokenGate> gate_;
};

// Plaintext credentials whose calls pass `gate` first: the core's insecure
// server credentials with a core auth metadata processor (see the header).
class PlaintextServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit PlaintextServerCredentials(std::shared_ptr<const TokenGate> gate)
      : gate_(std::move(gate)) {}
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    // Not used by meshnet: the gate is given at construction.
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    grpc_server_credentials* creds = grpc_insecure_server_credentials_create();
    // The core owns `state` from here and destroys it with the credentials,
    // after the last connection that uses them.
    grpc_server_credentials_set_auth_metadata_processor(
        creds, grpc_auth_metadata_processor{&Process, &Destroy,
                                            new std::shared_ptr<const TokenGate>(gate_)});
    const int port = grpc_server_add_http2_port(server, addr.c_str(), creds);
    grpc_server_credentials_release(creds);
    return port;
  }

  static void Process(void* state, grpc_auth_context*, const grpc_metadata* md, size_t num_md,
                      grpc_process_auth_metadata_done_cb done, void* user_data) {
    const auto& gate = *static_cast<std::shared_ptr<const TokenGate>*>(state);
    std::string_view path, authorization, proof;
    for (size_t i = 0; i < num_md; ++i) {
      if (View(md[i].key) == ":path") path = View(md[i].value);
      if (View(md[i].key) == "authorization") authorization = View(md[i].value);
      if (View(md[i].key) == kPeerProofMetadata) proof = View(md[i].value);
    }
    if (gate->Check(path, authorization, proof)) {
      done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
    } else {
      done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED, kRefused);
    }
  }
  static void Destroy(void* state) { delete static_cast<std::shared_ptr<const TokenGate>*>(state); }

  std::shared_ptr<const TokenGate> gate_;
};

}  // namespace

TokenGate::TokenGate(std::string_view token, std::string_view admin_token, std::string public_key,
                     std::function<void()> on_reject)
    : digest_(token.empty() ? "" : SecretDigest(BearerValue(token))),
      admin_digest_(admin_token.empty() ? "" : SecretDigest(BearerValue(admin_token))),
      public_key_(std::move(public_key)),
      on_reject_(std::move(on_reject)) {}

namespace {

std::string_view Metadata(const grpc::ServerContextBase& ctx, const char* key) {
  const auto& md = ctx.client_metadata();
  auto it = md.find(key);
  return it == md.end() ? std::string_view()
                        : std::string_view(it->second.data(), it->second.size());
}

}  // namespace

bool PresentsToken(const grpc::ServerContextBase& ctx, const std::string& digest) {
  if (digest.empty()) return true;
  return SecretMatches(Metadata(ctx, "authorization"), digest);
}

bool TokenGate::Admits(std::string_view path, std::string_view authorization,
                       std::string_view peer_proof) const {
  if (path.substr(0, kHealthPrefix.size()) == kHealthPrefix || path == kProve) return true;
  if (path == kDrain || path == kUndrain) {
    return !admin_digest_.empty() && SecretMatches(authorization, admin_digest_);
  }
  if (digest_.empty()) return true;
  // Digest comparison: constant time in the token's content and length.
  if (SecretMatches(authorization, digest_)) return true;
  return (path == kOfferImport || path == kImportSession) && !peer_proof.empty() &&
         PeerProofValid(digest_, public_key_, peer_proof);
}

bool TokenGate::Check(std::string_view path, std::string_view authorization,
                      std::string_view peer_proof) const {
  if (Admits(path, authorization, peer_proof)) return true;
  if (on_reject_) on_reject_();
  return false;
}

bool TokenGate::Admits(std::string_view path, const grpc::ServerContextBase& ctx) const {
  return Admits(path, Metadata(ctx, "authorization"), Metadata(ctx, kPeerProofMetadata));
}

std::shared_ptr<grpc::ServerCredentials> NodeServerCredentials(
    const NodeServerOptions& o, std::shared_ptr<const TokenGate> gate) {
  const bool gated = gate != nullptr;
  if (o.tls_cert.empty()) {
    if (!gated) return grpc::InsecureServerCredentials();
    return std::make_shared<PlaintextServerCredentials>(std::move(gate));
  }
  grpc::SslServerCredentialsOptions ssl(
      o.tls_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                       : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!o.tls_ca.empty()) ssl.pem_root_certs = ReadPemFile(o.tls_ca, "TLS CA");
  ssl.pem_key_cert_pairs.push_back(
      {ReadPemFile(o.tls_key, "TLS key"), ReadPemFile(o.tls_cert, "TLS certificate")});
  auto creds = grpc::SslServerCredentials(ssl);
  if (gated) creds->SetAuthMetadataProcessor(std::make_shared<GateProcessor>(std::move(gate)));
  return creds;
}

}  // namespace meshnet::rpc
