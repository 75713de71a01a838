// meshnet api: the OpenAI-compatible HTTP front door over a route of shards
// (in-process by default, gRPC nodes with --nodes or --registry). See src/api/.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "api/chat_format.h"
#include "api/engine.h"
#include "api/server.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/draft_model.h"
#include "cli/flags.h"
#include "cli/in_process_route.h"
#include "gguf/gguf_reader.h"
#include "mesh/generator.h"
#include "mesh/in_process.h"
#include "model/hparams.h"
#include "model/tokenizer.h"
#include "node/layer_range.h"
#include "util/error.h"
#include "util/sizes.h"
#include "util/thread_pool.h"
#ifdef MESHNET_WITH_RPC
#include "cli/remote_route.h"
#include "node/identity.h"
#include "rpc/registry_route.h"
#endif

namespace meshnet::cli {
namespace {

struct ApiFlags {
  std::string listen = "127.0.0.1:8080";
  std::string model;
  std::string model_name;
  int shards = 3;
  std::string split;
  std::string kv_budget = "64MiB";
  std::string kv_dtype = "float16";
  bool ggml_parity = false;
  int threads = 0;
  std::string nodes;
  std::string registry;
  registry::EtcdSecurity etcd;
  ClientSecurityFlags nodes_client;  // --auth-token, --node-tls-*
  double timeout_s = 30.0;
  int pipeline_depth = 0;                      // --pipeline-depth (rpc::ClientOptions)
  std::string forwarding = "star";             // --forwarding (rpc::ClientOptions::chain)
  int64_t prompt_chunk = kDefaultPromptChunk;  // --prompt-chunk
  std::string api_key;
  std::string tls_cert;
  std::string tls_key;
  int max_concurrent = 8;
  int queue = 64;
  std::string max_body = "1MiB";
  double head_timeout_s = 10.0;
  double body_timeout_s = 60.0;
  int max_connections = 512;
  int max_connections_per_ip = 64;
  int64_t ctx = 0;
  std::string chat_template;
  bool allow_control_in_content = false;
  int prefix_cache = 0;     // --prefix-cache: sessions kept for later prompts
  int speculate = 0;        // --speculate
  std::string draft_model;  // --draft-model
  double grace_s = 10.0;
  BatchFlags batch;
};

std::pair<std::string, int> ParseListen(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    ThrowInvalidArgument("--listen must be HOST:PORT, got '" + s + "'");
  }
  const std::string port = s.substr(colon + 1);
  int value = -1;
  try {
    size_t used = 0;
    value = std::stoi(port, &used);
    if (used != port.size()) value = -1;
  } catch (const std::exception&) {
  }
  if (value < 0 || value > 65535) ThrowInvalidArgument("--listen has a bad port: '" + s + "'");
  return {s.substr(0, colon), value};
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ThrowInvalidArgument("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Validate(const ApiFlags& f) {
  if (f.max_concurrent < 1) ThrowInvalidArgument("--max-concurrent must be >= 1");
  if (f.queue < 0) ThrowInvalidArgument("--queue must be >= 0");
  if (f.ctx < 0) ThrowInvalidArgument("--ctx must be >= 0 (0: the model's context)");
  if (!(f.grace_s >= 0)) ThrowInvalidArgument("--grace must be >= 0 seconds");
  if (f.threads < 0) ThrowInvalidArgument("--threads must be >= 0");
  if (ParseByteSize(f.max_body) <= 0) ThrowInvalidArgument("--max-body must be positive");
  if (!(f.head_timeout_s > 0 && f.head_timeout_s <= 3600)) {
    ThrowInvalidArgument("--head-timeout must be in (0, 3600] seconds");
  }
  if (!(f.body_timeout_s > 0 && f.body_timeout_s <= 3600)) {
    ThrowInvalidArgument("--body-timeout must be in (0, 3600] seconds");
  }
  if (f.max_connections < 1 || f.max_connections > 100000) {
    ThrowInvalidArgument("--max-connections must be in 1..100000");
  }
  if (f.max_connections_per_ip < 1 || f.max_connections_per_ip > f.max_connections) {
    ThrowInvalidArgument("--max-connections-per-ip must be in 1..--max-connections");
  }
}

// The route: an in-process mesh (owned here) or a shared remote provider.
struct RouteSetup {
  InProcessRoute local;
  std::shared_ptr<mesh::RouteProvider> remote;
  api::ProviderFactory factory;
};

// Forwards to the shared remote provider (safe for concurrent use).
class SharedProvider final : public mesh::RouteProvider {
 public:
  explicit SharedProvider(std::shared_ptr<mesh::RouteProvider> p) : p_(std::move(p)) {}
  mesh::Route Plan() override { return p_->Plan(); }
  void MarkDead(const mesh::ShardEndpoint& e) override { p_->MarkDead(e); }
  std::shared_ptr<mesh::ShardEndpoint> EndpointFor(const std::string& a) override {
    return p_->EndpointFor(a);
  }
  mesh::CohortCarrier* carrier() override { return p_->carrier(); }

 private:
  std::shared_ptr<mesh::RouteProvider> p_;
};

void SetUpRoute(const ApiFlags& f, std::shared_ptr<const gguf::GgufFile> file, RouteSetup& r) {
  if (f.nodes.empty() && f.registry.empty()) {
    // Every admitted generation holds a session on every shard.
    r.local = MakeInProcessRoute(file, {f.shards, f.split, f.kv_budget, f.kv_dtype, f.ggml_parity,
                                        f.threads, f.max_concurrent, f.batch});
    mesh::InProcessMesh* local = r.local.mesh.get();
    r.factory = [local] { return std::make_unique<mesh::FixedRouteProvider>(local->route()); };
    return;
  }
#ifdef MESHNET_WITH_RPC
  rpc::ClientOptions co;
  CopyClientSecurityFlags(f.nodes_client, &co);
  co.timeout_s = f.timeout_s;
  co.pipeline_depth = f.pipeline_depth;
  co.chain = f.forwarding == "chain";
  if (!f.registry.empty()) co.expected_model_id = node::ModelIdentity(*file);  // routed by id
  r.remote = MakeNodeRouteProvider(f.nodes, f.registry, co, f.etcd);
  auto remote = r.remote;
  r.factory = [remote] { return std::make_unique<SharedProvider>(remote); };
#else
  ThrowInvalidArgument("--nodes and --registry need a build with gRPC (MESHNET_RPC=ON)");
#endif
}

// --registry: the route costs go into the API's /metrics.
void ExposeRouteCosts(const std::shared_ptr<mesh::RouteProvider>& remote,
                      api::ApiMetrics& metrics) {
#ifdef MESHNET_WITH_RPC
  auto p = std::dynamic_pointer_cast<rpc::RegistryRouteProvider>(remote);
  if (p) metrics.SetExtra([p] { return p->MetricsText(); });
#endif
}

// --chat-template, else the GGUF's template, else ChatML.
api::ChatFormatter MakeFormatter(const ApiFlags& f, const gguf::GgufFile& file,
                                 const model::Tokenizer& tokenizer) {
  std::string source = f.chat_template.empty() ? "" : ReadFile(f.chat_template);
  if (f.chat_template.empty()) source = std::string(file.GetString("tokenizer.chat_template", ""));
  auto token_text = [&](model::TokenId id) {
    return id == model::kNoToken ? std::string() : tokenizer.TokenText(id);
  };
  return api::ChatFormatter(source, token_text(tokenizer.bos_id()), token_text(tokenizer.eos_id()));
}

api::ServerOptions MakeServerOptions(const ApiFlags& f) {
  api::ServerOptions so;
  so.api_key = f.api_key;
  if (so.api_key.empty()) {
    if (const char* env = std::getenv("MESHNET_API_KEY")) so.api_key = env;
  }
  so.tls_cert = f.tls_cert;
  so.tls_key = f.tls_key;
  so.max_body_bytes = static_cast<size_t>(ParseByteSize(f.max_body));
  // Every admitted or queued request holds a worker thread, plus room for
  // /health, /metrics and the 429 answers. Connections waiting for a request
  // (idle, or sending a head) hold none.
  so.worker_threads = f.max_concurrent + f.queue + 8;
  so.head_timeout_s = f.head_timeout_s;
  so.body_timeout_s = f.body_timeout_s;
  so.max_connections = f.max_connections;
  so.max_connections_per_ip = f.max_connections_per_ip;
  return so;
}

int RunApi(const ApiFlags& f) {
  Validate(f);
  const auto [host, port] = ParseListen(f.listen);
  // SIGINT/SIGTERM are taken by sigwait below: block them before any thread
  // starts. A client that hangs up must not kill the server with SIGPIPE.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const std::string model_path = f.model.empty() ? DefaultModelPath() : f.model;
  auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(model_path));
  const int64_t model_ctx = model::LlamaHParams::FromGguf(*file).context_length;
  if (f.ctx > 0 && model_ctx > 0 && f.ctx > model_ctx) {
    ThrowInvalidArgument("--ctx " + std::to_string(f.ctx) + " exceeds the model's context of " +
                         std::to_string(model_ctx));
  }
  model::Tokenizer tokenizer = model::Tokenizer::FromGguf(*file);
  api::ChatFormatter formatter = MakeFormatter(f, *file, tokenizer);

  RouteSetup route;
  SetUpRoute(f, file, route);
  api::EngineOptions eo;
  eo.model_name =
      f.model_name.empty() ? std::filesystem::path(model_path).stem().string() : f.model_name;
  eo.ctx = f.ctx > 0 ? f.ctx : (model_ctx > 0 ? model_ctx : 2048);
  eo.max_concurrent = f.max_concurrent;
  eo.max_queue = f.queue;
  eo.prefill_chunk = f.prompt_chunk;
  eo.allow_control_in_content = f.allow_control_in_content;
  eo.prefix_cache_sessions = f.prefix_cache;
  eo.speculate = f.speculate;
  eo.draft = OpenDraftModel(f.draft_model, tokenizer);
  if (eo.draft && eo.speculate == 0) eo.speculate = kDefaultDraftTokens;
  api::Engine engine(std::move(tokenizer), std::move(formatter), route.factory, eo);
  ExposeRouteCosts(route.remote, engine.metrics());

  api::ApiServer server(&engine, MakeServerOptions(f));
  const int bound = server.Bind(host, port);
  std::thread serving([&server] { server.Serve(); });
  std::printf("listening on %s:%d\n", host.c_str(), bound);
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "meshnet api: %s, stopping (grace %.1fs)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", f.grace_s);
  const auto grace_end = std::chrono::steady_clock::now() +
                         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(f.grace_s));
  engine.BeginShutdown(grace_end);
  // Connections not in a handler close now; generations stop before their
  // next token at the end of the grace; a second later whatever is still
  // open (a client that does not read its stream) is shut down.
  server.Stop(grace_end + std::chrono::seconds(1));
  serving.join();
  return 0;
}

// The HTTP side: keys, TLS, admission and the front door's limits.
void AddServerFlags(CLI::App* sub, ApiFlags* f) {
  sub->add_option("--api-key", f->api_key,
                  "Require 'Authorization: Bearer KEY' (or env MESHNET_API_KEY)");
  sub->add_option("--tls-cert", f->tls_cert, "Serve HTTPS with this certificate (PEM)");
  sub->add_option("--tls-key", f->tls_key, "Private key (PEM) for --tls-cert");
  sub->add_option("--max-concurrent", f->max_concurrent, "Generations running at once")
      ->capture_default_str();
  sub->add_option("--queue", f->queue, "Generations waiting for a slot (more: 429)")
      ->capture_default_str();
  sub->add_option("--max-body", f->max_body, "Largest request body (more: 413)")
      ->capture_default_str();
  sub->add_option("--head-timeout", f->head_timeout_s,
                  "Seconds a request head may take after its first byte (more: 408)")
      ->capture_default_str();
  sub->add_option("--body-timeout", f->body_timeout_s,
                  "Seconds a request body may take after its head (more: 408)")
      ->capture_default_str();
  sub->add_option("--max-connections", f->max_connections,
                  "Connections open at once (more: refused)")
      ->capture_default_str();
  sub->add_option("--max-connections-per-ip", f->max_connections_per_ip,
                  "Connections open at once from one IPv4 address or IPv6 /64 (more: 503)")
      ->capture_default_str();
}

void AddFlags(CLI::App* sub, ApiFlags* f) {
  sub->add_option("--listen", f->listen, "HOST:PORT to serve HTTP on (port 0: any free port)")
      ->capture_default_str();
  sub->add_option("--model,-m", f->model, "GGUF model file (default: models/stories260K.gguf)");
  sub->add_option("--model-name", f->model_name, "Model id to serve (default: the file's stem)");
  sub->add_option("--shards", f->shards, "Number of in-process shards (even split)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--split", f->split, "Explicit in-process split, e.g. 0-1,2-3,4-4");
  sub->add_option("--kv-budget", f->kv_budget, "KV byte budget per in-process shard")
      ->capture_default_str();
  sub->add_option("--kv-dtype", f->kv_dtype,
                  "KV cache dtype: float32, float16, bfloat16, q8_0 (half f16's bytes) or q4_0")
      ->capture_default_str();
  sub->add_flag("--ggml-parity", f->ggml_parity,
                "Compute as llama.cpp's CPU backend does (its default attention, norms, RoPE, "
                "SwiGLU, F16/Q8_0/Q5_1 matmuls), for bit parity with its greedy text; "
                "needs --kv-dtype f16; slower");
  sub->add_option("--threads", f->threads, "Compute threads (0 = all cores)")
      ->capture_default_str();
  sub->add_option("--nodes", f->nodes, "Comma-separated host:port of meshnet serve nodes");
  sub->add_option("--registry", f->registry,
                  "Plan routes from a registry instead of --nodes: HOST:PORT (meshnet registry), "
                  "etcd://HOST:PORT/prefix or etcds://HOST:PORT/prefix (TLS)");
  AddEtcdFlags(sub, &f->etcd);
  ClientSecurityFlags& nc = f->nodes_client;
  sub->add_option("--auth-token", nc.auth_token, "Cluster token sent to the nodes");
  sub->add_option("--node-tls-ca", nc.tls_ca, "CA certificate (PEM) to verify nodes");
  sub->add_option("--node-tls-cert", nc.tls_cert, "Client certificate (PEM) for the nodes");
  sub->add_option("--node-tls-key", nc.tls_key, "Client private key (PEM) for the nodes");
  sub->add_option("--timeout", f->timeout_s, "Per-call deadline in seconds for --nodes/--registry")
      ->capture_default_str();
  AddPipelineDepthFlag(sub, &f->pipeline_depth);
  AddForwardingFlag(sub, &f->forwarding);
  AddPromptChunkFlag(sub, &f->prompt_chunk);
  AddServerFlags(sub, f);
  sub->add_option("--ctx", f->ctx, "Positions per request, prompt + completion (0: the model's)")
      ->capture_default_str();
  sub->add_option("--chat-template", f->chat_template,
                  "Jinja chat template file (default: the GGUF's, else ChatML)");
  sub->add_flag("--allow-control-in-content", f->allow_control_in_content,
                "Let control-token text in chat messages and tools (<|im_start|>, </s> ...) "
                "become control tokens (default: it stays text)");
  sub->add_option("--prefix-cache", f->prefix_cache,
                  "Keep up to N sessions' KV on their hops after their requests end; a later "
                  "request (same cache_salt) whose prompt starts with one's text, e.g. the next "
                  "turn of a chat, computes only the rest (0: off; 0..4096)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  AddSpeculationFlags(sub, &f->speculate, &f->draft_model,
                      "; not with logprobs, penalties or logit_bias");
  sub->add_option("--grace", f->grace_s, "Seconds in-flight requests get to finish on shutdown")
      ->capture_default_str();
  AddBatchFlags(sub, &f->batch, "each in-process shard");
}

const CommandRegistrar kApiCommand(
    {"api", "Serve the OpenAI-compatible HTTP API (and a chat page) over a route of shards",
     [](CLI::App* sub, int* exit_code) {
       auto f = std::make_shared<ApiFlags>();
       AddFlags(sub, f.get());
       sub->callback([f, exit_code] { *exit_code = RunApi(*f); });
     }});

}  // namespace
}  // namespace meshnet::cli
