// Synthetic Llama GGUF files with deterministic pseudo-random weights, for
// tests, benchmarks and `make-model`-style tooling. Every key and tensor name
// comes from the architecture registry.
//
// The file lays tensors out the way llama.cpp does: token_embd, output_norm,
// output (unless tied), then blk.0.* .. blk.<n-1>.*, so a layer range is one
// contiguous byte range of the file. The vocabulary is <unk> <s> </s>, the
// 256 byte tokens when they fit, then filler pieces.
//
// The perturbation fields (omit_*, *_override) exist to build malformed files
// for negative tests.
//
// Thread-safety: plain functions over values.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gguf/gguf_writer.h"
#include "ops/ggml_type.h"

namespace meshnet::model {

struct SyntheticLlamaSpec {
  std::string architecture = "llama";  // general.architecture (also the key prefix)
  int n_embd = 64;
  int n_layers = 4;
  int n_heads = 8;
  int n_kv_heads = 4;
  int n_ff = 128;
  int vocab_size = 300;
  int64_t context_length = 256;
  int n_rot = 0;             // 0: no rope.dimension_count key (defaults to head_dim)
  float rope_freq_base = 0;  // 0: no key (defaults to 10000)
  float rms_eps = 1e-5f;
  GgmlType weight_type = GgmlType::kF32;  // all matrices; norms are always F32
  bool tie_output = false;                // no output.weight
  bool with_tokenizer = true;
  uint32_t seed = 1;

  // Perturbations.
  std::set<std::string> omit_keys;
  std::set<std::string> omit_tensors;
  std::map<std::string, std::vector<int64_t>> dims_override;  // GGUF order
  std::map<std::string, GgmlType> type_override;
};

// A writer holding the whole model (tensor data is generated at write time,
// so building a large file never holds it in memory).
gguf::GgufWriter SyntheticLlamaWriter(const SyntheticLlamaSpec& spec);

}  // namespace meshnet::model
