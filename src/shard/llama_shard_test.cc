// LlamaShard's LM head: the rows a batch finishes (LogitsRows, which the
// node's batcher uses) get the logits of Logits one row at a time, bit for
// bit, in the default arithmetic and in llama.cpp's (ggml_parity), whose
// final norm the batched path once skipped.
#include "shard/llama_shard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gguf/gguf_reader.h"

namespace meshnet::shard {
namespace {

TEST(LlamaShardLogits, RowsEqualEachRowAloneInBothArithmetics) {
  auto file = std::make_shared<const gguf::GgufFile>(
      gguf::GgufFile::Open(std::string(MESHNET_SOURCE_DIR) + "/models/stories260K.gguf"));
  for (bool parity : {false, true}) {
    const LlamaShard shard(file, 0, 4, nullptr, parity);  // the whole model: the tail
    const int64_t n_embd = shard.hparams().n_embd, vocab = shard.hparams().vocab_size;
    constexpr int64_t kRows = 5;
    std::mt19937 rng(3);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> hidden(static_cast<size_t>(kRows * n_embd));
    for (float& v : hidden) v = dist(rng);
    std::vector<float> rows(static_cast<size_t>(kRows * vocab)), one(static_cast<size_t>(vocab));
    shard.LogitsRows(hidden.data(), kRows, rows.data());
    for (int64_t i = 0; i < kRows; ++i) {
      shard.Logits(hidden.data() + i * n_embd, one.data());
      EXPECT_EQ(0, std::memcmp(one.data(), rows.data() + i * vocab, one.size() * sizeof(float)))
          << "row " << i << (parity ? " (ggml parity)" : "");
    }
  }
}

}  // namespace
}  // namespace meshnet::shard
