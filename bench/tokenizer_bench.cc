// Tokenizer encode throughput.
//
// BM_Encode: the shipped model's SentencePiece vocabulary, against a quadratic
// SentencePiece BPE (rescan every pair each round) measured in the same run:
// counter `speedup_vs_quadratic` = quadratic time / heap time.
//
// BM_Tokenize: 1 MB of English and 1 MB of mixed-script text through
// llama.cpp's test vocabularies (tests/data/tokenizers): SentencePiece
// (llama-spm) and byte-level BPE (gpt-2, starcoder, deepseek-llm). bytes_per_second
// is the encode throughput; counter `vs_spm` = SentencePiece time / this
// vocabulary's time on the same text, measured in the same run. The English
// and mixed texts repeat a few paragraphs (so BPE's per-call word memo hits
// almost always); *_novel_words is 1 MB of distinct pseudo-random words, BPE's
// worst case. Times are thread CPU time (the machine is shared).
#include <benchmark/benchmark.h>
#include <time.h>

#include <chrono>
#include <limits>
#include <map>
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

const Tokenizer& Vocab(const std::string& name) {
  static auto* cache = new std::map<std::string, Tokenizer>();
  auto it = cache->find(name);
  if (it == cache->end()) {
    const auto file =
        gguf::GgufFile::Open(std::string(MESHNET_TOKENIZER_DATA) + "/ggml-vocab-" + name + ".gguf");
    it = cache->emplace(name, Tokenizer::FromGguf(file)).first;
  }
  return it->second;
}

std::string Repeat(const std::vector<std::string>& paragraphs, size_t bytes) {
  std::string text;
  for (size_t i = 0; text.size() < bytes; ++i) text += paragraphs[i % paragraphs.size()] + "\n";
  text.resize(bytes);
  // Cut at a character boundary.
  while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xC0) == 0x80) text.pop_back();
  if (!text.empty() && static_cast<unsigned char>(text.back()) >= 0xC0) text.pop_back();
  return text;
}

const std::string& English() {
  static const std::string text = Repeat(
      {"The harbour was quiet in the early morning, and the fishing boats rocked gently against "
       "the pier while gulls argued over scraps near the market stalls.",
       "In 1887, the engineers finished the bridge after nine years of work; it cost 2,450,000 "
       "pounds, and nobody expected it to last more than a century.",
       "\"Don't forget the keys,\" she said, though he'd already locked the door and walked "
       "halfway to the station without them.",
       "Researchers measured the temperature every 15 minutes (from 06:00 to 18:30) and reported "
       "a mean of 21.7 degrees with a standard deviation of 3.2.",
       "Most of the library's older volumes were moved to the basement, where the humidity is "
       "controlled and readers must request them a day in advance.",
       "If you want to contribute, please open an issue first: describe the problem, what you "
       "expected to happen, and what actually happened instead."},
      1 << 20);
  return text;
}

const std::string& Mixed() {
  static const std::string text = Repeat(
      {"Grüße aus München! Die Straßenbahn fährt um 7:45 Uhr ab, aber heute ist sie verspätet.",
       "Съешь же ещё этих мягких французских булок, да выпей чаю — сказал он в 2021 году.",
       "東京の夜は明るくて、駅の近くには小さなラーメン屋がたくさんあります。",
       "我们在北京的会议将于明天上午九点开始，请大家准时参加。",
       "مرحبا بالعالم، هذا نص عربي قصير للاختبار.",
       "Κάθε πρωί πίνω καφέ στο μπαλκόνι και διαβάζω εφημερίδα.",
       "def main():\n    for i in range(10):\n        print(f\"{i:>3} -> {i * i}\")  # 🦙 ✓",
       "한국어 문장도 조금 넣어 봅니다. 오늘 날씨가 정말 좋네요!"},
      1 << 20);
  return text;
}

// Thread CPU seconds: the machine is shared, so wall time would count waiting.
double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// 1 MB of pseudo-random lowercase words: almost no word repeats, so the BPE
// word memo never helps (the worst case for natural-language text).
const std::string& NovelWords() {
  static const std::string text = [] {
    std::string t;
    uint64_t state = 1;
    auto next = [&state] {
      return (state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33;
    };
    while (t.size() < (1u << 20)) {
      t += ' ';
      for (int i = 0, n = 3 + static_cast<int>(next() % 7); i < n; ++i) {
        t += "etaoinshrdlucmfwypvbgkq"[next() % 23];
      }
    }
    t.resize(1u << 20);
    return t;
  }();
  return text;
}

double SecondsPerEncode(const Tokenizer& tok, const std::string& text) {
  const double t0 = CpuSeconds();
  auto ids = tok.Tokenize(text, false, false);
  benchmark::DoNotOptimize(ids.data());
  return CpuSeconds() - t0;
}

enum Corpus { kEnglish, kMixed, kNovel };

void BM_Tokenize(benchmark::State& state, const char* vocab, Corpus corpus) {
  const Tokenizer& tok = Vocab(vocab);
  const std::string& text = corpus == kMixed   ? Mixed()
                            : corpus == kNovel ? NovelWords()
                                               : English();
  size_t n_tokens = 0;
  double total_s = 0;
  int64_t iters = 0;
  for (auto _ : state) {
    const double t0 = CpuSeconds();
    auto ids = tok.Tokenize(text, false, false);
    total_s += CpuSeconds() - t0;
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
    ++iters;
  }
  state.SetBytesProcessed(iters * static_cast<int64_t>(text.size()));
  state.counters["tokens"] = static_cast<double>(n_tokens);
  state.counters["MB_per_cpu_s"] = static_cast<double>(text.size()) * iters / total_s / 1e6;
  state.counters["vs_spm"] = SecondsPerEncode(Vocab("llama-spm"), text) / (total_s / iters);
}
BENCHMARK_CAPTURE(BM_Tokenize, spm_english, "llama-spm", kEnglish)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Tokenize, gpt2_english, "gpt-2", kEnglish)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Tokenize, starcoder_english, "starcoder", kEnglish)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Tokenize, deepseek_llm_english, "deepseek-llm", kEnglish)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Tokenize, spm_novel_words, "llama-spm", kNovel)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Tokenize, gpt2_novel_words, "gpt-2", kNovel)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Tokenize, spm_mixed, "llama-spm", kMixed)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Tokenize, gpt2_mixed, "gpt-2", kMixed)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Tokenize, starcoder_mixed, "starcoder", kMixed)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Tokenize, deepseek_llm_mixed, "deepseek-llm", kMixed)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace meshnet::model

BENCHMARK_MAIN();
