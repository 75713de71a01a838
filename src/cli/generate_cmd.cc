// meshnet generate: text generation over a route of shards, in-process by
// default or over gRPC nodes with --nodes.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/draft_model.h"
#include "cli/flags.h"
#include "cli/generate_load.h"
#include "cli/in_process_route.h"
#include "gguf/gguf_reader.h"
#include "mesh/generator.h"
#include "mesh/in_process.h"
#include "model/tokenizer.h"
#include "node/identity.h"
#include "node/layer_range.h"
#include "util/error.h"
#include "util/sizes.h"
#include "util/thread_pool.h"
#ifdef MESHNET_WITH_RPC
#include "cli/remote_route.h"
#endif

namespace meshnet::cli {
namespace {

struct GenerateFlags {
  std::string prompt;
  std::string model;
  int shards = 3;
  std::string split;
  int max_tokens = 64;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  std::string kv_budget = "64MiB";
  std::string kv_dtype = "float16";
  bool ggml_parity = false;
  int threads = 0;
  std::string output = "text";
  std::string nodes;
  std::string registry;
  registry::EtcdSecurity etcd;
  ClientSecurityFlags client;
  double timeout_s = 30.0;
  int pipeline_depth = 0;                      // --pipeline-depth (rpc::ClientOptions)
  std::string forwarding = "star";             // --forwarding (rpc::ClientOptions::chain)
  int64_t prompt_chunk = kDefaultPromptChunk;  // --prompt-chunk
  int speculate = 0;                           // --speculate
  std::string draft_model;                     // --draft-model
  bool no_bos = false;
  bool special = false;
  std::string dump_logits;
  std::string force_file;  // --force-file: teacher forcing
  int64_t ctx = 0;
  int sessions = 0;              // --sessions: the load mode (0: not given)
  bool load = false;             // --sessions was given
  std::string in_process_flags;  // in-process-only flags given, e.g. "--split"
  BatchFlags batch;
};

using LogitsFile = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

// --dump-logits: each step's logits as one JSON array per line. The returned
// file must outlive the generation (events.on_logits writes to it).
LogitsFile DumpLogitsTo(const std::string& path, mesh::GenerateEvents& events) {
  LogitsFile out(nullptr, &std::fclose);
  if (path.empty()) return out;
  out.reset(std::fopen(path.c_str(), "w"));
  if (!out) ThrowInvalidArgument("cannot write --dump-logits '" + path + "'");
  events.on_logits = [file = out.get()](std::span<const float> logits) {
    std::string line = "[";
    char buf[32];
    for (size_t i = 0; i < logits.size(); ++i) {
      std::snprintf(buf, sizeof(buf), i == 0 ? "%.9g" : ",%.9g", static_cast<double>(logits[i]));
      line += buf;
    }
    line += "]\n";
    std::fwrite(line.data(), 1, line.size(), file);
  };
  return out;
}

volatile std::sig_atomic_t g_cancel_signal = 0;

void OnCancelSignal(int sig) { g_cancel_signal = sig; }

void InstallCancelHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnCancelSignal;
  sa.sa_flags = SA_RESETHAND;  // the second signal takes the default action
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int CancelSignal() { return g_cancel_signal; }

// Writes `text` to stdout at once (streamed output).
void PrintNow(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

// --sessions N: a count in range, and no flag of the single-session mode.
void CheckLoadFlags(const GenerateFlags& f) {
  if (!f.load) return;
  CheckLoadSessions(f.sessions);
  if (!f.dump_logits.empty())
    ThrowInvalidArgument("--dump-logits is not available with --sessions");
  if (!f.force_file.empty()) ThrowInvalidArgument("--force-file is not available with --sessions");
}

void CheckGenerateFlags(const GenerateFlags& f) {
  if (f.output != "text" && f.output != "json") {
    ThrowInvalidArgument("--output must be text or json, got '" + f.output + "'");
  }
  CheckLoadFlags(f);
  if ((!f.nodes.empty() || !f.registry.empty()) && !f.in_process_flags.empty()) {
    ThrowInvalidArgument(
        f.in_process_flags +
        " set the in-process shards; with --nodes or --registry each node has its own "
        "(meshnet serve --kv-budget, --layers, --kv-dtype, --ggml-parity, --threads, "
        "--max-batch-*)");
  }
}

// The text of --force-file (at most 16 MiB).
std::string ReadForceFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ThrowInvalidArgument("cannot read --force-file '" + path + "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > (size_t{16} << 20)) {
    ThrowInvalidArgument("--force-file '" + path + "' is larger than 16 MiB");
  }
  return text;
}

// Length limit, sampling, stop tokens and Ctrl-C handling of a generation.
mesh::GenerateOptions MakeGenerateOptions(const GenerateFlags& f, const gguf::GgufFile& file,
                                          const model::Tokenizer& tokenizer) {
  mesh::GenerateOptions options;
  options.max_tokens = f.max_tokens;
  const int64_t model_ctx = model::LlamaHParams::FromGguf(file).context_length;
  if (f.ctx > model_ctx) {
    ThrowInvalidArgument("--ctx " + std::to_string(f.ctx) +
                         " is beyond the model's context length " + std::to_string(model_ctx));
  }
  options.context_length = f.ctx > 0 ? f.ctx : model_ctx;
  // Ctrl-C (SIGINT) or SIGTERM: stop after the current step and release the
  // session on every node (a second signal ends the process at once).
  InstallCancelHandlers();
  options.cancelled = [] { return g_cancel_signal != 0; };
  options.sampling.temperature = f.temperature;
  options.sampling.top_k = f.top_k;
  options.sampling.top_p = f.top_p;
  options.sampling.seed = f.seed;
  options.sampling.Validate();
  if (tokenizer.eos_id() != model::kNoToken) options.eos_id = tokenizer.eos_id();
  options.stop_ids = tokenizer.eog_ids();  // eos, eot, eom, ...
  options.prefill_chunk = f.prompt_chunk;
  options.speculate = f.speculate;
  options.draft = OpenDraftModel(f.draft_model, tokenizer);
  if (options.draft && options.speculate == 0) options.speculate = kDefaultDraftTokens;
  if (!f.force_file.empty()) {
    options.forced_ids = tokenizer.Tokenize(ReadForceFile(f.force_file), false, f.special);
  }
  return options;
}

// The route: in-process shards, or nodes from --nodes / --registry.
struct GenerateRoute {
  InProcessRoute local;
  std::unique_ptr<mesh::RouteProvider> provider;
};

GenerateRoute MakeGenerateRoute(const GenerateFlags& f,
                                const std::shared_ptr<const gguf::GgufFile>& file) {
  GenerateRoute r;
  if (f.nodes.empty() && f.registry.empty()) {
    r.local = MakeInProcessRoute(file, {f.shards, f.split, f.kv_budget, f.kv_dtype, f.ggml_parity,
                                        f.threads, f.sessions, f.batch});
    r.provider = std::make_unique<mesh::FixedRouteProvider>(r.local.mesh->route());
    return r;
  }
#ifdef MESHNET_WITH_RPC
  rpc::ClientOptions co;
  CopyClientSecurityFlags(f.client, &co);
  co.timeout_s = f.timeout_s;
  co.pipeline_depth = f.pipeline_depth;
  co.chain = f.forwarding == "chain";
  co.expected_model_id = node::ModelIdentity(*file);  // the tokenizer's model
  co.Validate();
  r.provider = MakeNodeRouteProvider(f.nodes, f.registry, co, f.etcd);
#else
  ThrowInvalidArgument("--nodes and --registry need a build with gRPC (MESHNET_RPC=ON)");
#endif
  return r;
}

// --output json's "route": passes through the route, their time, tokens per
// pass, and where the hops said their compute (chain), compute and links.
nlohmann::ordered_json RouteJson(const mesh::GenerateResult& r) {
  nlohmann::ordered_json j = {
      {"passes", r.route_passes},
      {"seconds", r.route_seconds},
      {"tokens_per_pass", static_cast<double>(r.generated_ids.size()) /
                              static_cast<double>(std::max<int64_t>(1, r.route_passes))}};
  if (r.measured_passes > 0) {
    j["measured_passes"] = r.measured_passes;
    j["compute_seconds"] = r.measured_compute_seconds;
    j["link_seconds"] = std::max(0.0, r.measured_seconds - r.measured_compute_seconds);
  }
  return j;
}

// One generation, streamed to stdout (or printed as JSON at the end).
int RunOneGeneration(const GenerateFlags& f, mesh::RouteProvider& provider,
                     const model::Tokenizer& tokenizer, const std::vector<int32_t>& prompt_ids,
                     const mesh::GenerateOptions& options) {
  const bool json = f.output == "json";
  std::string text;
  int32_t prev = prompt_ids.back();
  mesh::GenerateEvents events;
  // Byte-level pieces may end inside a UTF-8 character: stream whole characters.
  model::Utf8Assembler assembler;
  events.on_token = [&](int32_t id) {
    const std::string piece = tokenizer.DecodePiece(prev, id);
    prev = id;
    text += piece;
    if (!json) PrintNow(assembler.Push(piece));
  };
  const LogitsFile logits_out = DumpLogitsTo(f.dump_logits, events);
  events.on_recovery = [](const std::string& what) {
    std::fprintf(stderr, "meshnet: %s\n", what.c_str());
  };
  if (!json) PrintNow(tokenizer.Decode(prompt_ids));
  mesh::GenerateResult result;
  try {
    result = mesh::Generate(provider, prompt_ids, options, events);
  } catch (const Error& e) {
    if (g_cancel_signal == 0) throw;
    std::fprintf(stderr, "\nmeshnet: interrupted; the session was released\n");
    return 128 + g_cancel_signal;
  }
  if (result.stop_reason == "context_length") {
    std::fprintf(stderr, "\nmeshnet: stopped at the context length (%lld tokens)\n",
                 static_cast<long long>(options.context_length));
  }
  if (json) {
    nlohmann::ordered_json out;
    out["prompt_ids"] = prompt_ids;
    out["generated_ids"] = result.generated_ids;
    out["text"] = text;
    if (options.speculate > 0) {
      out["speculation"] = {{"verify_steps", result.verify_steps},
                            {"drafted", result.drafted},
                            {"accepted", result.accepted}};
    }
    out["route"] = RouteJson(result);
    std::cout << out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  } else {
    PrintNow(assembler.Flush() + "\n");
    if (options.speculate > 0) {
      std::fprintf(stderr,
                   "meshnet: speculation: %lld of %lld drafts accepted in %lld steps, %.2f "
                   "tokens per route pass\n",
                   static_cast<long long>(result.accepted), static_cast<long long>(result.drafted),
                   static_cast<long long>(result.verify_steps),
                   static_cast<double>(result.generated_ids.size()) /
                       static_cast<double>(std::max<int64_t>(1, result.route_passes)));
    }
  }
  return 0;
}

int RunGenerate(const GenerateFlags& f) {
  CheckGenerateFlags(f);
  const std::string model_path = f.model.empty() ? DefaultModelPath() : f.model;
  auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(model_path));
  const model::Tokenizer tokenizer = model::Tokenizer::FromGguf(*file);
  const mesh::GenerateOptions options = MakeGenerateOptions(f, *file, tokenizer);
  const std::vector<int32_t> prompt_ids = tokenizer.Tokenize(f.prompt, !f.no_bos, f.special);
  if (prompt_ids.empty()) ThrowInvalidArgument("the prompt encodes to no tokens; give --prompt");
  GenerateRoute route = MakeGenerateRoute(f, file);
  if (f.load) {
    return RunGenerateSessions(*route.provider, tokenizer, prompt_ids, options, f.sessions,
                               f.output == "json", &CancelSignal);
  }
  return RunOneGeneration(f, *route.provider, tokenizer, prompt_ids, options);
}

// The prompt, the model, sampling and the in-process route's flags (help
// order); appends the in-process ones to *in_process.
void AddGenerateModelFlags(CLI::App* sub, GenerateFlags* f, std::vector<CLI::Option*>* in_process) {
  sub->add_option("--prompt,-p", f->prompt, "Prompt text")->required();
  sub->add_option("--model,-m", f->model,
                  "GGUF model file (default: models/stories260K.gguf, looked up in the "
                  "current directory, then above the executable)");
  auto* shards = sub->add_option("--shards", f->shards, "Number of in-process shards (even split)")
                     ->capture_default_str()
                     ->check(IntRange(1, kMaxShards));
  auto* split = sub->add_option("--split", f->split,
                                "Explicit in-process split, e.g. 0-1,2-3,4-4 (overrides --shards)");
  sub->add_option("--max-tokens,-n", f->max_tokens, "Tokens to generate")
      ->capture_default_str()
      ->check(IntRange(0, kMaxGenerateTokens));
  sub->add_option("--temperature", f->temperature, "Sampling temperature (0 = greedy)")
      ->capture_default_str();
  sub->add_option("--top-k", f->top_k, "Keep the k most likely tokens (0 = all)")
      ->capture_default_str()
      ->check(IntRange(0, 1 << 30));
  sub->add_option("--top-p", f->top_p, "Nucleus sampling mass in (0, 1]")->capture_default_str();
  sub->add_option("--seed", f->seed, "Sampling seed (same seed, same tokens)")
      ->capture_default_str();
  auto* budget = sub->add_option("--kv-budget", f->kv_budget,
                                 "KV byte budget per in-process shard, e.g. 64MiB")
                     ->capture_default_str();
  auto* dtype = sub->add_option("--kv-dtype", f->kv_dtype,
                                "KV cache dtype of the in-process shards: float32, float16, "
                                "bfloat16 (or f32, f16, bf16), q8_0 (half f16's bytes) or q4_0")
                    ->capture_default_str();
  auto* parity =
      sub->add_flag("--ggml-parity", f->ggml_parity,
                    "Compute as llama.cpp's CPU backend does (its default attention, norms, RoPE, "
                    "SwiGLU, F16/Q8_0/Q5_1 matmuls), for bit parity with its greedy text; "
                    "needs --kv-dtype f16; slower");
  auto* threads = sub->add_option("--threads", f->threads, "Compute threads (0 = all cores)")
                      ->capture_default_str()
                      ->check(IntRange(0, kMaxThreads));
  in_process->insert(in_process->end(), {shards, split, budget, dtype, parity, threads});
}

// Output, load mode and the remote route's flags; returns --sessions.
CLI::Option* AddGenerateOutputFlags(CLI::App* sub, GenerateFlags* f) {
  sub->add_option("--output", f->output, "text (stream) or json")->capture_default_str();
  sub->add_flag("--no-bos", f->no_bos,
                "Add no BOS/EOS (default: as the model's add_bos/add_eos say)");
  sub->add_flag("--special", f->special, "Parse control tokens (e.g. <|im_start|>) in the prompt");
  sub->add_option("--dump-logits", f->dump_logits,
                  "Write each step's logits to this file, one JSON array per line");
  sub->add_option("--force-file", f->force_file,
                  "Teacher forcing: the generated tokens are this text's (tokenized without "
                  "BOS), up to --max-tokens, whatever the model samples; with --dump-logits, "
                  "the logits at each of its positions (e.g. to compare KV dtypes)");
  sub->add_option("--ctx", f->ctx,
                  "Context length to stay within (0 = the model's); a longer prompt is "
                  "refused, generation stops when it is full")
      ->capture_default_str()
      ->check(IntRange(0, 1 << 30));
  CLI::Option* sessions = sub->add_option(
      "--sessions", f->sessions,
      "Load mode: run N (1-1024) concurrent sessions of the prompt through one client and "
      "print each one's output and the aggregate tokens/s, TTFT and inter-token latency");
  sub->add_option("--nodes", f->nodes, "Comma-separated host:port of meshnet serve nodes");
  sub->add_option("--registry", f->registry,
                  "Plan routes from a registry instead of --nodes: HOST:PORT (meshnet "
                  "registry), etcd://HOST:PORT/prefix or etcds://HOST:PORT/prefix (TLS)");
  AddEtcdFlags(sub, &f->etcd);
  AddClientSecurityFlags(sub, &f->client, "Cluster token sent to the nodes",
                         "CA certificate (PEM) to verify nodes over TLS");
  sub->add_option("--timeout", f->timeout_s,
                  "Per-call deadline in seconds for --nodes/--registry (at most a year is used)")
      ->capture_default_str();
  AddPipelineDepthFlag(sub, &f->pipeline_depth);
  AddForwardingFlag(sub, &f->forwarding);
  AddPromptChunkFlag(sub, &f->prompt_chunk);
  AddSpeculationFlags(sub, &f->speculate, &f->draft_model, "");
  return sessions;
}

void SetupGenerate(CLI::App* sub, int* exit_code) {
  auto f = std::make_shared<GenerateFlags>();
  std::vector<CLI::Option*> in_process;
  AddGenerateModelFlags(sub, f.get(), &in_process);
  CLI::Option* sessions = AddGenerateOutputFlags(sub, f.get());
  for (CLI::Option* o : AddBatchFlags(sub, &f->batch, "each in-process shard")) {
    in_process.push_back(o);
  }
  sub->callback([=] {
    f->load = sessions->count() > 0;
    for (const CLI::Option* o : in_process) {
      if (o->count() == 0) continue;
      f->in_process_flags += (f->in_process_flags.empty() ? "" : ", ") + o->get_name();
    }
    *exit_code = RunGenerate(*f);
  });
}

const CommandRegistrar kGenerateCommand(
    {"generate",
     "Generate text over a route of shards (in-process by default, gRPC nodes with --nodes or "
     "--registry)",
     SetupGenerate});

}  // namespace
}  // namespace meshnet::cli
