// Tokenizer encode throughput on the shipped model's vocabulary, against a
// quadratic SentencePiece BPE (rescan every pair each round) measured in the
// same run: counter `speedup_vs_quadratic` = quadratic time / heap time.
#include <benchmark/benchmark.h>

#include <chrono>
#include <limits>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "model/tokenizer.h"

namespace meshnet::model {
namespace {

const Tokenizer& Shipped() {
  static const Tokenizer* tok = [] {
    const auto file = gguf::GgufFile::Open(MESHNET_SHIPPED_MODEL);
    return new Tokenizer(Tokenizer::FromGguf(file));
  }();
  return *tok;
}

std::string Text(size_t bytes) {
  static const std::string kStory =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.\n"
      "Lily's mom said ";
  std::string text;
  while (text.size() < bytes) text += kStory;
  text.resize(bytes);
  return text;
}

// The baseline: merge the best pair found by a full rescan, one merge per round.
size_t QuadraticEncode(const Tokenizer& tok, const std::string& text) {
  std::string s = "\xE2\x96\x81";
  for (char c : text) s += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
  std::vector<std::string> sym;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    sym.push_back(s.substr(i, len));
    i += len;
  }
  for (;;) {
    int best = -1;
    float best_score = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      const TokenId id = tok.Find(sym[i] + sym[i + 1]);
      if (id != kNoToken && tok.Type(id) == TokenType::kNormal &&
          (best < 0 || tok.Score(id) > best_score)) {
        best = static_cast<int>(i);
        best_score = tok.Score(id);
      }
    }
    if (best < 0) break;
    sym[best] += sym[best + 1];
    sym.erase(sym.begin() + best + 1);
  }
  return sym.size();
}

void BM_Encode(benchmark::State& state) {
  const Tokenizer& tok = Shipped();
  const std::string text = Text(static_cast<size_t>(state.range(0)));
  size_t n_tokens = 0;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t iters = 0;
  for (auto _ : state) {
    auto ids = tok.Encode(text, true);
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
    ++iters;
  }
  const double heap_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;

  const auto q0 = std::chrono::steady_clock::now();
  const size_t q_tokens = QuadraticEncode(tok, text);
  const double quad_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - q0).count();
  if (q_tokens + 1 != n_tokens) state.SkipWithError("quadratic baseline disagrees");

  state.SetBytesProcessed(iters * static_cast<int64_t>(text.size()));
  state.counters["tokens"] = static_cast<double>(n_tokens);
  state.counters["speedup_vs_quadratic"] = quad_s / heap_s;
}
BENCHMARK(BM_Encode)->Arg(1 << 10)->Arg(1 << 12)->Arg(1 << 14)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace meshnet::model

BENCHMARK_MAIN();
