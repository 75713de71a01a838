#include "cli/flags.h"

#include <charconv>

#include "cli/draft_model.h"

namespace meshnet::cli {

CLI::Validator IntRange(int64_t lo, int64_t hi) {
  const std::string range = std::to_string(lo) + ".." + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi) {
          return "must be an integer in " + range + ", got '" + text + "'";
        }
        return "";
      },
      "INT in " + range);
}

std::vector<CLI::Option*> AddBatchFlags(CLI::App* sub, BatchFlags* f, const std::string& whose) {
  const std::string tokens = std::to_string(node::BatchOptions::kMaxTokens);
  return {
      sub->add_option("--max-batch-tokens", f->max_batch_tokens,
                      "Token rows " + whose +
                          " computes in one batched forward pass across "
                          "sessions (1.." +
                          tokens + ")")
          ->capture_default_str(),
      sub->add_option("--max-batch-sessions", f->max_batch_sessions,
                      "Sessions batched in one forward pass (1 = no batching; 1.." +
                          std::to_string(node::BatchOptions::kMaxSessions) + ")")
          ->capture_default_str(),
      sub->add_option("--prefill-chunk", f->prefill_chunk,
                      "Prompt tokens of one session per batch: longer prompts run in chunks "
                      "between other sessions' decode steps (1.." +
                          tokens + ")")
          ->capture_default_str(),
      sub->add_option("--prefill-share", f->prefill_share,
                      "While sessions decode, long prompts' rows run beside their steps and "
                      "add at most this share of their measured round (the time between two "
                      "of their batches here; 0 = only --prefill-chunk bounds them; 0..16)")
          ->capture_default_str(),
      sub->add_option("--short-prompt", f->short_prompt,
                      "Prompts of at most this many tokens (and one --prefill-chunk) run whole "
                      "beside decode steps, not bounded by --prefill-share (0 = none; 0.." +
                          tokens + ")")
          ->capture_default_str(),
  };
}

node::BatchOptions BatchOptionsFrom(const BatchFlags& f) {
  node::BatchOptions o;
  o.max_batch_tokens = f.max_batch_tokens;
  o.max_batch_sessions = f.max_batch_sessions;
  o.prefill_chunk = f.prefill_chunk;
  o.prefill_share = f.prefill_share;
  o.short_prompt = f.short_prompt;
  o.Validate();
  return o;
}

void AddServerSecurityFlags(CLI::App* sub, ServerSecurityFlags* f, const std::string& auth_help) {
  sub->add_option("--auth-token", f->auth_token, auth_help);
  sub->add_option("--tls-cert", f->tls_cert, "Server certificate chain (PEM); enables TLS");
  sub->add_option("--tls-key", f->tls_key, "Server private key (PEM)");
  sub->add_option("--tls-ca", f->tls_ca, "CA (PEM) for client certificates: mutual TLS");
}

void AddPipelineDepthFlag(CLI::App* sub, int* depth) {
  sub->add_option(
         "--pipeline-depth", *depth,
         "Grouped step calls in flight at once over the nodes, the call to the earliest layers "
         "first (0 = no limit: every node computes at once, for nodes on machines of their "
         "own; 1 = all sessions as one batch through one node at a time, their decode steps "
         "carried from hop to hop by one client thread, for nodes sharing a machine's cores)")
      ->check(CLI::Range(0, kMaxPipelineDepth))
      ->capture_default_str();
}

void AddForwardingFlag(CLI::App* sub, std::string* forwarding) {
  sub->add_option("--forwarding", *forwarding,
                  "How a step crosses the nodes: 'star' (this client sends each hop its input "
                  "and takes its answer: 2 x hops link crossings a token) or 'chain' (the head "
                  "sends its activations on to the next node itself, and so on, and the tail "
                  "sends the token straight back here: hops + 1 crossings; each node forwards "
                  "only along this client's route, to nodes that prove they serve the next "
                  "layers of the same model)")
      ->check(CLI::IsMember({"star", "chain"}))
      ->capture_default_str();
}

void AddSpeculationFlags(CLI::App* sub, int* speculate, std::string* draft_model,
                         const std::string& note) {
  sub->add_option("--speculate", *speculate,
                  "Speculative decoding: up to K draft tokens per step from prompt lookup (the "
                  "tokens that followed the text's last 3, 2 or 1 tokens earlier on) or "
                  "--draft-model, verified by the route in one pass; the output is the same as "
                  "without (0 = off" +
                      note + ")")
      ->capture_default_str()
      ->check(IntRange(0, 64));
  sub->add_option("--draft-model", *draft_model,
                  "Speculative decoding's drafts from this small GGUF model, run here (same "
                  "vocabulary as --model, else refused), instead of prompt lookup; --speculate "
                  "defaults to " +
                      std::to_string(kDefaultDraftTokens) +
                      " with it. The output is the same as without");
}

void AddPromptChunkFlag(CLI::App* sub, int64_t* chunk) {
  sub->add_option("--prompt-chunk", *chunk,
                  "Send a prompt longer than this many tokens through a route of two or more "
                  "hops in pieces of at most this many, pipelined: each hop works on a piece "
                  "while the next hop works on the one before, and no message carries more (0 "
                  "= whole, as on a route of one hop)")
      ->check(IntRange(0, int64_t{1} << 30))
      ->capture_default_str();
}

void AddEtcdFlags(CLI::App* sub, registry::EtcdSecurity* f) {
  sub->add_option("--etcd-ca", f->ca_file,
                  "With --registry etcds://...: CA (PEM) of etcd's server certificate. Without "
                  "any --etcd-* flag, etcds:// uses this command's cluster TLS files (--tls-*; "
                  "api: --node-tls-*); with no CA at all, the system CAs");
  sub->add_option("--etcd-cert", f->cert_file,
                  "With --registry etcds://...: client certificate (PEM) for etcd's "
                  "--client-cert-auth");
  sub->add_option("--etcd-key", f->key_file, "With --registry etcds://...: its private key (PEM)");
  sub->add_option("--etcd-user", f->user,
                  "With --registry etcd(s)://...: etcd user, for an etcd with auth enabled");
  sub->add_option("--etcd-password", f->password,
                  "Password of --etcd-user (prefer $MESHNET_ETCD_PASSWORD: flags show in ps)")
      ->envname("MESHNET_ETCD_PASSWORD");
}

void AddClientSecurityFlags(CLI::App* sub, ClientSecurityFlags* f, const std::string& auth_help,
                            const std::string& ca_help) {
  sub->add_option("--auth-token", f->auth_token, auth_help);
  sub->add_option("--tls-ca", f->tls_ca, ca_help);
  sub->add_option("--tls-cert", f->tls_cert, "Client certificate (PEM) for mutual TLS");
  sub->add_option("--tls-key", f->tls_key, "Client private key (PEM) for mutual TLS");
}

}  // namespace meshnet::cli
