// Bounds of count flags, shared by the subcommands (see also cli/common.h).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "cli/common.h"
#include "node/batcher.h"
#include "registry/etcd_registry.h"

namespace meshnet::cli {

// Bounds of count flags, checked at parse time (a pool of 100000 threads or a
// 2^31-token KV block is a typo, not a configuration).
inline constexpr int kMaxThreads = 256;        // --threads (compute)
inline constexpr int kMaxRpcThreads = 1024;    // --rpc-threads
inline constexpr int kMaxBlockTokens = 65536;  // --block-tokens
inline constexpr int64_t kMaxSessions = 1000000;
inline constexpr int kMaxShards = 1024;
inline constexpr int kMaxGenerateTokens = 1000000;

// CLI11 validator: an integer in [lo, hi], with a message naming the range.
CLI::Validator IntRange(int64_t lo, int64_t hi);

// --max-batch-tokens, --max-batch-sessions, --prefill-chunk, --prefill-share,
// --short-prompt
// (node/batcher.h), for `serve` and the in-process route of `generate` and `api`.
struct BatchFlags {
  int64_t max_batch_tokens = node::BatchOptions{}.max_batch_tokens;
  int64_t max_batch_sessions = node::BatchOptions{}.max_batch_sessions;
  int64_t prefill_chunk = node::BatchOptions{}.prefill_chunk;
  double prefill_share = node::BatchOptions{}.prefill_share;
  int64_t short_prompt = node::BatchOptions{}.short_prompt;
};
// Adds the five flags to `sub` (`whose`: "this node" or "each in-process
// shard", for the help text); returns them (to see which were given).
std::vector<CLI::Option*> AddBatchFlags(CLI::App* sub, BatchFlags* f, const std::string& whose);
// The options, validated: out of range throws kInvalidArgument (exit 2).
node::BatchOptions BatchOptionsFrom(const BatchFlags& f);

// --auth-token, --tls-cert, --tls-key and --tls-ca of a server (`serve`,
// `registry`): how its callers prove themselves.
struct ServerSecurityFlags {
  std::string auth_token;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
};
// Adds the five flags to `sub`, in that order (`auth_help`: --auth-token's help).
void AddServerSecurityFlags(CLI::App* sub, ServerSecurityFlags* f, const std::string& auth_help);
// Copies them into a server's options (rpc::NodeServerOptions,
// rpc::RegistryServerOptions); the token from $MESHNET_AUTH_TOKEN if no flag.
template <typename ServerOptions>
void CopyServerSecurityFlags(const ServerSecurityFlags& f, ServerOptions* o) {
  o->auth_token = AuthTokenOrEnv(f.auth_token);
  o->tls_cert = f.tls_cert;
  o->tls_key = f.tls_key;
  o->tls_ca = f.tls_ca;
}

// --auth-token, --tls-ca, --tls-cert and --tls-key of a client of nodes or of
// a registry (`generate`, `api` as --node-tls-*, `status`, `admin drain`).
struct ClientSecurityFlags {
  std::string auth_token;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
};
// Adds the five flags to `sub`, in that order, with the help texts given for
// the token and the CA (the certificate and key say "for mutual TLS").
void AddClientSecurityFlags(CLI::App* sub, ClientSecurityFlags* f, const std::string& auth_help,
                            const std::string& ca_help);
// Copies them, the token as given, into rpc::ClientOptions.
template <typename ClientOptions>
void CopyClientSecurityFlags(const ClientSecurityFlags& f, ClientOptions* o) {
  o->auth_token = f.auth_token;
  o->tls_ca = f.tls_ca;
  o->tls_cert = f.tls_cert;
  o->tls_key = f.tls_key;
}

// --etcd-ca, --etcd-cert and --etcd-key: the files for an etcds:// --registry
// whose PKI is not the cluster's (without them, etcds:// uses the command's
// cluster TLS flags); --etcd-user and --etcd-password ($MESHNET_ETCD_PASSWORD)
// for an etcd with auth. Every command that takes --registry has them.
void AddEtcdFlags(CLI::App* sub, registry::EtcdSecurity* f);

// --pipeline-depth (rpc::ClientOptions::pipeline_depth), for the commands that
// drive sessions over nodes.
inline constexpr int kMaxPipelineDepth = 1024;
void AddPipelineDepthFlag(CLI::App* sub, int* depth);

// --forwarding star|chain (rpc::ClientOptions::chain), for the commands that
// drive sessions over nodes.
void AddForwardingFlag(CLI::App* sub, std::string* forwarding);

// --speculate K (0..64) and --draft-model FILE (cli/draft_model.h), for the
// commands that drive generations; `note` ends --speculate's help.
void AddSpeculationFlags(CLI::App* sub, int* speculate, std::string* draft_model,
                         const std::string& note);

// --prompt-chunk (mesh::GenerateOptions::prefill_chunk), default
// kDefaultPromptChunk, for the commands that drive sessions over a route.
inline constexpr int64_t kDefaultPromptChunk = 256;
void AddPromptChunkFlag(CLI::App* sub, int64_t* chunk);

}  // namespace meshnet::cli
