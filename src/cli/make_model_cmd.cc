// meshnet make-model: writes a random-weight Llama-family GGUF of the given
// dimensions and weight type, with the tokenizer of another GGUF (see
// gguf/make_model.h for the weights it draws). Bad flags exit with code 2.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "gguf/make_model.h"
#include "ops/ggml_type.h"
#include "util/error.h"
#include "util/sizes.h"

namespace meshnet::cli {
namespace {

GgmlType ParseTypeFlag(const char* flag, const std::string& s) {
  if (auto t = ParseGgmlType(s)) return *t;
  throw Error(ErrorKind::kInvalidArgument, std::string(flag) + " '" + s +
                                               "' is not a supported type (f32, f16, bf16, "
                                               "q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, "
                                               "q3_k, q4_k, q5_k, q6_k, iq4_xs)");
}

struct MakeModelFlags {
  gguf::MakeModelOptions o;
  std::string out;
  std::string tokenizer_from;
  std::string type = "q8_0";
  std::string embd_type;
  int64_t n_kv_heads = 0;
};

void AddMakeModelOptions(CLI::App* sub, MakeModelFlags* flags) {
  gguf::MakeModelOptions& o = flags->o;
  sub->add_option("--out", flags->out, "Output GGUF path")->required();
  sub->add_option(
         "--tokenizer-from", flags->tokenizer_from,
         "GGUF whose tokenizer.* keys are copied (SentencePiece or byte-level BPE: tokens, "
         "merges, pre, ...; e.g. models/stories260K.gguf)")
      ->required();
  sub->add_option("--n-embd", o.n_embd, "Embedding length")->capture_default_str();
  sub->add_option("--n-layers", o.n_layers, "Number of blocks")->capture_default_str();
  sub->add_option("--n-heads", o.n_heads, "Attention heads")->capture_default_str();
  sub->add_option("--n-kv-heads", flags->n_kv_heads, "KV heads (default: --n-heads)");
  sub->add_option("--n-ff", o.n_ff, "Feed-forward length")->capture_default_str();
  sub->add_option("--type", flags->type,
                  "Weight type of the 2-D matrices: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 "
                  "iq4_nl q2_k q3_k q4_k q5_k q6_k iq4_xs; a comma-separated list makes the "
                  "matrices cycle through the types in file order")
      ->capture_default_str();
  sub->add_option("--embd-type", flags->embd_type, "Type of token_embd (default: --type)");
  sub->add_option("--seed", o.seed, "Random seed")->capture_default_str();
  sub->add_option("--context", o.context, "Context length")->capture_default_str();
  sub->add_option("--rope-base", o.rope_base, "RoPE frequency base")->capture_default_str();
  sub->add_option("--rms-eps", o.rms_eps, "RMSNorm epsilon")->capture_default_str();
  sub->add_option("--arch", o.architecture,
                  "Architecture (certified name: llama, mistral, qwen2; qwen2 adds Q/K/V biases)")
      ->capture_default_str();
  sub->add_option("--name", o.name, "general.name")->capture_default_str();
  sub->add_flag("--rope-freqs", o.rope_freqs,
                "Add rope_freqs.weight with Llama 3.1's RoPE frequency factors");
  sub->add_flag("--tie-output", o.tie_output,
                "Write no output.weight (the LM head is tied to token_embd)");
}

void RunMakeModel(const MakeModelFlags& flags) {
  gguf::MakeModelOptions o = flags.o;
  o.type = ParseTypeFlag("--type", flags.type.substr(0, flags.type.find(',')));
  if (flags.type.find(',') != std::string::npos) {
    size_t start = 0;
    while (start <= flags.type.size()) {
      const size_t comma = std::min(flags.type.find(',', start), flags.type.size());
      o.mix_types.push_back(ParseTypeFlag("--type", flags.type.substr(start, comma - start)));
      start = comma + 1;
    }
  }
  if (!flags.embd_type.empty()) o.embedding_type = ParseTypeFlag("--embd-type", flags.embd_type);
  o.n_kv_heads = flags.n_kv_heads > 0 ? flags.n_kv_heads : o.n_heads;
  if (flags.n_kv_heads < 0) {
    throw Error(ErrorKind::kInvalidArgument, "--n-kv-heads must be positive");
  }
  const gguf::MakeModelSummary s = gguf::MakeModel(o, flags.tokenizer_from, flags.out);
  std::printf(
      "wrote %s: %s, %lld layers, n_embd %lld, %lld tensors, %.2f M parameters, "
      "vocab %lld, %s\n",
      flags.out.c_str(), std::string(GgmlTypeInfoOf(o.type).name).c_str(),
      static_cast<long long>(o.n_layers), static_cast<long long>(o.n_embd),
      static_cast<long long>(s.n_tensors), static_cast<double>(s.n_params) / 1e6,
      static_cast<long long>(s.vocab_size),
      FormatByteSize(static_cast<int64_t>(s.file_bytes)).c_str());
}

void SetupMakeModel(CLI::App* sub, int* exit_code) {
  auto flags = std::make_shared<MakeModelFlags>();
  AddMakeModelOptions(sub, flags.get());
  sub->footer(
      "Weights are N(0, 1/fan_in) (residual projections scaled by 1/sqrt(2*n_layers)), norms "
      "are ones.\nExit status: 0 on success, 2 for bad flags or an unreadable tokenizer file.");
  sub->callback([flags, exit_code] {
    RunMakeModel(*flags);
    *exit_code = 0;
  });
}

const CommandRegistrar kMakeModelCommand(
    {"make-model", "Write a random-weight Llama GGUF of given dimensions and weight type",
     SetupMakeModel});

}  // namespace
}  // namespace meshnet::cli
