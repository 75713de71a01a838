// meshnet serve: one node of the mesh. Loads the owned layers of a GGUF model,
// keeps hot KV state for sessions within a byte budget, and serves the
// MeshNode gRPC service (proto/meshnet.proto), health checks and /metrics.
//
// The first line on stdout is "listening on HOST:PORT" (the bound port when
// --listen asks for port 0); with --metrics-listen the second is
// "metrics on HOST:PORT". Logs go to stderr. SIGINT/SIGTERM stop accepting
// calls and let in-flight steps finish (up to --grace seconds); with
// --drain-to, or with --registry (its replicas of this range), they first
// hand live sessions to replicas (serve_drain.h); before
// the node serves, or a second time, they end the process at once.
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/flags.h"
#include "cli/serve_drain.h"
#include "cli/serve_registry.h"
#include "gguf/gguf_reader.h"
#include "kv/hot_kv_state.h"
#include "model/hparams.h"
#include "node/layer_range.h"
#include "node/node.h"
#include "rpc/remote.h"
#include "rpc/server.h"
#include "util/error.h"
#include "util/sizes.h"
#include "util/stop_signals.h"
#include "util/thread_pool.h"

namespace meshnet::cli {
namespace {

struct ServeFlags {
  std::string model;
  std::string layers;
  std::string listen = "127.0.0.1:0";
  std::string advertise;  // --advertise
  std::string kv_budget = "64MiB";
  int64_t max_sessions = 8;
  double ttl_s = 600.0;
  std::string kv_dtype = "float16";
  bool ggml_parity = false;
  int threads = 0;
  int block_tokens = 16;
  std::string metrics_listen;
  ServerSecurityFlags security;
  double grace_s = 10.0;
  int rpc_threads = 64;
  std::string log_level = "info";
  bool insecure = false;
  int64_t max_message_bytes = 0;
  double admission_wait_s = 10.0;
  int64_t admission_queue = 16;
  double active_window_s = 30.0;
  int max_calls_per_peer = 32;
  BatchFlags batch;
  std::string drain_to;  // host:port,... of replicas to hand sessions to on a stop signal
  ServeRegistryFlags registry;
  int64_t max_new_sessions_per_minute = 3000;
  int kv_transfer_port = 0;
  std::string admin_token;  // Drain/Undrain (default: $MESHNET_ADMIN_TOKEN)
  std::string node_key;     // PEM file of the node's Ed25519 key
};

// One block of `block_tokens` positions must fit the byte budget, or every
// step would be refused: say so at start.
void CheckBlockFitsBudget(const kv::KvCacheRecipe& recipe, const kv::HotKvStateConfig& c) {
  const int64_t per_token = recipe.BytesPerToken();
  if (per_token > 0 && c.block_tokens > c.budget_bytes / per_token) {
    ThrowInvalidArgument("--block-tokens " + std::to_string(c.block_tokens) + ": one KV block of " +
                         "this shard needs " + std::to_string(c.block_tokens) + " x " +
                         std::to_string(per_token) + " bytes, more than --kv-budget " +
                         FormatByteSize(c.budget_bytes) + "; lower --block-tokens (at most " +
                         std::to_string(c.budget_bytes / per_token) + ") or raise --kv-budget");
  }
}

// Logs: stderr, one line per event, key=value fields.
void SetUpLogging(const std::string& log_level) {
  auto logger = spdlog::stderr_color_mt("meshnet");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e level=%l %v");
  const auto level = spdlog::level::from_str(log_level);
  if (level == spdlog::level::off && log_level != "off") {
    ThrowInvalidArgument("--log-level must be trace, debug, info, warn, error or off");
  }
  spdlog::set_level(level);
}

kv::HotKvStateConfig KvConfigFrom(const ServeFlags& f) {
  kv::HotKvStateConfig c;
  c.budget_bytes = ParseByteSize(f.kv_budget);
  c.max_sessions = f.max_sessions;
  c.ttl_seconds = f.ttl_s;
  c.block_tokens = f.block_tokens;
  // Sessions with a step within --active-window keep their KV room against
  // later ones (kv/hot_kv_state.h, active_seconds).
  c.active_seconds = f.active_window_s;
  c.Validate();
  return c;
}

// The server's options, validated (token from $MESHNET_AUTH_TOKEN if no flag).
rpc::NodeServerOptions ServerOptionsFrom(const ServeFlags& f) {
  rpc::NodeServerOptions o;
  o.listen = f.listen;
  o.advertise = f.advertise;
  o.metrics_listen = f.metrics_listen;
  CopyServerSecurityFlags(f.security, &o);
  o.max_rpc_threads = f.rpc_threads;
  o.insecure = f.insecure;
  o.max_message_bytes = f.max_message_bytes;
  o.max_calls_per_peer = f.max_calls_per_peer;
  o.max_new_sessions_per_minute = f.max_new_sessions_per_minute;
  o.kv_transfer_port = f.kv_transfer_port;
  o.admin_token = AdminTokenOrEnv(f.admin_token);
  o.node_key_file = f.node_key;
  o.admission.max_wait_s = f.admission_wait_s;
  o.admission.max_waiting = f.admission_queue;
  o.admission.active_window_s = f.active_window_s;
  o.peers = DrainPeerOptions(o);
  o.Validate();
  return o;
}

int RunServe(const ServeFlags& f) {
  // First, before any thread starts: SIGINT/SIGTERM end the process at any
  // time, and drain it gracefully once it serves (util/stop_signals.h).
  StopSignals stop;
  SetUpLogging(f.log_level);
  if (f.layers.empty()) ThrowInvalidArgument("--layers A-B is required");
  if (!(f.grace_s >= 0 && f.grace_s <= 3600)) {
    ThrowInvalidArgument("--grace must be in [0, 3600] seconds");
  }
  const node::LayerRange range = node::ParseLayerRange(f.layers);
  node::NodeOptions node_options;
  node_options.layers = range;
  node_options.kv_config = KvConfigFrom(f);
  node_options.kv_dtype = ParseKvDtypeFlag(f.kv_dtype);
  node_options.ggml_parity = f.ggml_parity;
  node_options.batch = BatchOptionsFrom(f.batch);
  const rpc::NodeServerOptions options = ServerOptionsFrom(f);
  const std::vector<std::string> drain_to =
      f.drain_to.empty() ? std::vector<std::string>{} : rpc::ParseNodeList(f.drain_to);

  const std::string model_path = f.model.empty() ? DefaultModelPath() : f.model;
  auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(model_path));
  ThreadPool pool(f.threads);
  node::Node node(file, node_options, &pool);
  CheckBlockFitsBudget(node.manager().recipe(), node_options.kv_config);
  rpc::NodeServer server(&node, options);
  server.Start();
  std::printf("listening on %s\n", server.bound_address().c_str());
  if (!server.metrics_address().empty()) {
    std::printf("metrics on %s\n", server.metrics_address().c_str());
  }
  std::shared_ptr<ServeRegistry> announced =
      StartServeRegistry(f.registry, server, options.auth_token, f.security.tls_ca,
                         f.security.tls_cert, f.security.tls_key, f.insecure);
  InstallDrainHooks(server, announced);
  std::fflush(stdout);
  const kv::HotKvStateConfig& kc = node_options.kv_config;
  spdlog::info(
      "event=ready model={} layers={}-{} of={} kv_budget={} kv_dtype={} block_tokens={} "
      "max_sessions={} threads={}",
      model_path, range.first, range.second, model::LlamaHParams::FromGguf(*file).n_layers,
      FormatByteSize(kc.budget_bytes), KvDtypeName(node_options.kv_dtype), kc.block_tokens,
      kc.max_sessions, pool.num_threads());

  stop.Arm();
  const int sig = stop.Wait();
  spdlog::info("event=stopping signal={} grace_s={} drain_to={}",
               sig == SIGINT ? "SIGINT" : "SIGTERM", f.grace_s, f.drain_to);
  StopServing(server, drain_to, std::move(announced), f.grace_s);
  spdlog::info("event=stopped");
  return 0;
}

// What the node computes and holds: model, layers, KV, threads.
void AddServeNodeFlags(CLI::App* sub, ServeFlags* f) {
  sub->add_option("--model,-m", f->model,
                  "GGUF model file (default: models/stories260K.gguf, looked up in the "
                  "current directory, then above the executable)");
  sub->add_option("--layers", f->layers, "Owned layer range A-B (inclusive), e.g. 0-7")->required();
  sub->add_option("--listen", f->listen, "host:port to serve on (port 0: pick a free one)")
      ->capture_default_str();
  sub->add_option("--advertise", f->advertise,
                  "host:port others reach this node at, when not --listen (a NAT, a proxy): "
                  "what it announces and proves, and its name on a client's chain route "
                  "(default: the --listen address)");
  sub->add_option("--kv-budget", f->kv_budget, "KV byte budget, e.g. 64MiB or 2GiB")
      ->capture_default_str();
  sub->add_option("--max-sessions", f->max_sessions, "Live sessions before LRU eviction")
      ->capture_default_str()
      ->check(IntRange(1, kMaxSessions));
  sub->add_option("--ttl", f->ttl_s, "Idle seconds before a session expires (0 = never)")
      ->capture_default_str();
  sub->add_option("--kv-dtype", f->kv_dtype,
                  "KV cache dtype: float32, float16, bfloat16 (or f32, f16, bf16), q8_0 "
                  "(8.5 bits a value, half f16's bytes) or q4_0 (4.5 bits)")
      ->capture_default_str();
  sub->add_flag("--ggml-parity", f->ggml_parity,
                "Compute as llama.cpp's CPU backend does (its default attention, norms, "
                "RoPE, SwiGLU, F16/Q8_0/Q5_1 matmuls), for bit parity with its greedy "
                "text; needs --kv-dtype f16; slower");
  sub->add_option("--threads", f->threads, "Compute threads (0 = all cores)")
      ->capture_default_str()
      ->check(IntRange(0, kMaxThreads));
  sub->add_option("--block-tokens", f->block_tokens,
                  "Positions per KV block (one block must fit --kv-budget)")
      ->capture_default_str()
      ->check(IntRange(1, kMaxBlockTokens));
  sub->add_option("--metrics-listen", f->metrics_listen,
                  "host:port for Prometheus /metrics (port 0: pick a free one)");
}

// Who may tell it what, and who it is: the admin token and the node key.
void AddServeTrustFlags(CLI::App* sub, ServeFlags* f) {
  sub->add_option("--admin-token", f->admin_token,
                  "Operator token for `meshnet admin drain/undrain` (default: "
                  "$MESHNET_ADMIN_TOKEN; must differ from the cluster token; none: admin calls "
                  "are refused)");
  sub->add_option("--node-key", f->node_key,
                  "PEM file of this node's Ed25519 key, created on first use (mode 0600); it "
                  "signs the node's registry record and proves its identity to the registry "
                  "and to draining peers (default: a fresh key per start)");
}

// How it serves: security, gRPC limits, admission, batching, draining, the registry.
void AddServeServerFlags(CLI::App* sub, ServeFlags* f) {
  AddServerSecurityFlags(sub, &f->security,
                         "Cluster token every call must carry (default: $MESHNET_AUTH_TOKEN)");
  sub->add_option("--grace", f->grace_s, "Seconds to let in-flight steps finish on shutdown")
      ->capture_default_str();
  sub->add_option("--rpc-threads", f->rpc_threads, "Maximum gRPC handler threads")
      ->capture_default_str()
      ->check(IntRange(2, kMaxRpcThreads));
  sub->add_option("--log-level", f->log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  sub->add_flag("--insecure", f->insecure,
                "Allow a non-loopback --listen without --auth-token or --tls-ca");
  sub->add_option("--max-message-bytes", f->max_message_bytes,
                  "Largest gRPC message (0 = a full-context step of this shard + 1 MiB)")
      ->capture_default_str()
      ->check(IntRange(0, 2147483647));
  sub->add_option("--admission-wait", f->admission_wait_s,
                  "Seconds a new session waits for a slot when --max-sessions are active, "
                  "before RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  sub->add_option("--admission-queue", f->admission_queue,
                  "New sessions that may wait at once (more are refused at once)")
      ->capture_default_str()
      ->check(IntRange(0, 4096));
  sub->add_option("--active-window", f->active_window_s,
                  "Seconds since its last step that a session counts as active "
                  "(never evicted to admit a new one; keeps its KV room against "
                  "sessions that arrived after it)")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 86400.0));
  sub->add_option(
         "--max-calls-per-peer", f->max_calls_per_peer,
         "Concurrent Step/Truncate calls one client (address, or client certificate) may have")
      ->capture_default_str()
      ->check(IntRange(1, kMaxRpcThreads));
  AddBatchFlags(sub, &f->batch, "this node");
  sub->add_option("--drain-to", f->drain_to,
                  "On SIGINT/SIGTERM, hand live sessions (their verified KV) to these "
                  "replicas of the same layer range (host:port,...) within --grace, "
                  "instead of letting them re-prefill elsewhere (default with --registry: "
                  "the registry's replicas of this range with room); each must first prove "
                  "it is a node of this range (and, with a token, of this cluster)");
  AddServeRegistryFlags(sub, &f->registry);
  sub->add_option("--max-new-sessions-per-minute", f->max_new_sessions_per_minute,
                  "Sessions one client (address, or client certificate) may open per "
                  "minute, 1..1000000; more get RESOURCE_EXHAUSTED with a retry hint")
      ->capture_default_str();  // range: NodeServerOptions::Validate (exit 2)
  sub->add_option("--kv-transfer-port", f->kv_transfer_port,
                  "TCP port on the --listen host where sessions moved to this node (drains) "
                  "send their KV, off the gRPC path (checked as over gRPC, after an "
                  "authenticated gRPC offer; one-time tickets): 0 any free port, -1 none "
                  "(imports stream over gRPC). Not opened with --tls-cert (it is plaintext)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 65535));
}

void SetupServe(CLI::App* sub, int* exit_code) {
  auto f = std::make_shared<ServeFlags>();
  AddServeNodeFlags(sub, f.get());
  AddServeServerFlags(sub, f.get());
  AddServeTrustFlags(sub, f.get());
  sub->callback([f, exit_code] { *exit_code = RunServe(*f); });
}

const CommandRegistrar kServeCommand({"serve",
                                      "Serve a layer range of a model as a mesh node over gRPC",
                                      SetupServe});

}  // namespace
}  // namespace meshnet::cli
