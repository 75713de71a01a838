// End-to-end generation on the shipped stories260K model through in-process
// shards: the reference continuation, split invariance, cached decode vs
// recompute, and recovery from a forced eviction.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

#include "gguf/gguf_reader.h"
#include "mesh/draft.h"
#include "mesh/generator.h"
#include "mesh/in_process.h"
#include "model/tokenizer.h"
#include "node/identity.h"
#include "node/layer_range.h"
#include "util/thread_pool.h"

namespace meshnet::mesh {
namespace {

const std::string kModel = std::string(MESHNET_SOURCE_DIR) + "/models/stories260K.gguf";

std::shared_ptr<const gguf::GgufFile> File() {
  static auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(kModel));
  return file;
}

ThreadPool* Pool() {
  static ThreadPool pool(2);
  return &pool;
}

// The greedy continuation documented in models/README.md ("Quick check").
std::string ReferenceContinuation() {
  std::ifstream in(std::string(MESHNET_SOURCE_DIR) + "/models/README.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  const size_t intro = s.find("The first 64 new tokens give:");
  const size_t open = s.find("```\n", intro);
  const size_t close = s.find("\n```", open + 4);
  EXPECT_NE(intro, std::string::npos);
  return s.substr(open + 4, close - open - 4);
}

struct RunOutput {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  int re_prefills = 0;
};

RunOutput Generate(InProcessMesh& mesh, const std::vector<int32_t>& prompt, int n,
                   const GenerateEvents& extra = {}, shard::SamplingContract sampling = {},
                   int64_t prefill_chunk = 0) {
  FixedRouteProvider provider(mesh.route());
  GenerateOptions o;
  o.max_tokens = n;
  o.sampling = sampling;
  o.prefill_chunk = prefill_chunk;
  RunOutput run;
  GenerateEvents ev = extra;
  ev.on_logits = [&](std::span<const float> l) { run.logits.emplace_back(l.begin(), l.end()); };
  GenerateResult r = mesh::Generate(provider, prompt, o, ev);
  run.tokens = r.generated_ids;
  run.re_prefills = r.re_prefills;
  return run;
}

std::vector<int32_t> Prompt() {
  return model::Tokenizer::FromGguf(*File()).Encode("Once upon a time", true);
}

TEST(Generation, GreedyMatchesTheReferenceContinuation) {
  const auto tok = model::Tokenizer::FromGguf(*File());
  const std::vector<int32_t> prompt = Prompt();
  ASSERT_EQ(prompt, (std::vector<int32_t>{1, 403, 407, 261, 378}));
  InProcessMeshOptions mo;
  mo.split = node::EvenSplit(3, 5);
  InProcessMesh mesh(File(), mo, Pool());
  RunOutput run = Generate(mesh, prompt, 64);
  ASSERT_EQ(run.tokens.size(), 64u);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), run.tokens.begin(), run.tokens.end());
  EXPECT_EQ(tok.Decode(all), ReferenceContinuation());
  // README: at the last prompt position ',' (432) ~17.80 and ' there' (383) ~14.28.
  EXPECT_NEAR(run.logits[0][432], 17.80f, 0.01f);
  EXPECT_NEAR(run.logits[0][383], 14.28f, 0.01f);
}

// Every composition of the 5 layers into 1..5 contiguous shards.
std::vector<std::vector<node::LayerRange>> AllSplits(int layers) {
  std::vector<std::vector<node::LayerRange>> out;
  for (int mask = 0; mask < (1 << (layers - 1)); ++mask) {
    std::vector<node::LayerRange> split;
    int start = 0;
    for (int l = 0; l < layers; ++l) {
      if (l == layers - 1 || (mask >> l & 1)) {
        split.emplace_back(start, l);
        start = l + 1;
      }
    }
    out.push_back(split);
  }
  return out;
}

TEST(Generation, EverySplitGivesIdenticalTokensAndLogits) {
  const std::vector<int32_t> prompt = Prompt();
  InProcessMeshOptions whole;
  InProcessMesh unsplit(File(), whole, Pool());
  const RunOutput ref = Generate(unsplit, prompt, 24);
  const auto splits = AllSplits(5);
  ASSERT_EQ(splits.size(), 16u);
  for (const auto& split : splits) {
    InProcessMeshOptions mo;
    mo.split = split;
    InProcessMesh mesh(File(), mo, Pool());
    const RunOutput run = Generate(mesh, prompt, 24);
    ASSERT_EQ(run.tokens, ref.tokens) << mesh.route().Describe();
    for (size_t s = 0; s < ref.logits.size(); ++s) {
      for (size_t i = 0; i < ref.logits[s].size(); ++i) {
        ASSERT_NEAR(run.logits[s][i], ref.logits[s][i], 1e-5) << mesh.route().Describe();
      }
    }
  }
}

TEST(Generation, CachedDecodeEqualsFullRecompute) {
  const std::vector<int32_t> prompt = Prompt();
  InProcessMeshOptions mo;
  mo.split = node::EvenSplit(3, 5);
  // An F32 cache: the 1e-4 bound is about reusing state. Rounded to F16, a
  // K/V value whose last bits differ between a many-row prompt matmul and a
  // one-row decode matmul can land a whole F16 step apart (~1e-3).
  mo.kv_dtype = KvDtype::kF32;
  InProcessMesh mesh(File(), mo, Pool());
  const RunOutput cached = Generate(mesh, prompt, 64);
  ASSERT_EQ(cached.logits.size(), 64u);
  // Recompute each step from scratch: a fresh session prefilled with the whole
  // history, so no cached state is reused.
  std::vector<int32_t> history = prompt;
  double worst = 0;
  for (int s = 0; s < 64; ++s) {
    const RunOutput fresh = Generate(mesh, history, 1);
    for (size_t i = 0; i < fresh.logits[0].size(); ++i) {
      worst =
          std::max(worst, static_cast<double>(std::abs(fresh.logits[0][i] - cached.logits[s][i])));
    }
    history.push_back(cached.tokens[s]);
  }
  EXPECT_LE(worst, 1e-4);
}

TEST(Generation, ForcedEvictionReprefillsAndKeepsTheOutput) {
  const std::vector<int32_t> prompt = Prompt();
  InProcessMeshOptions mo;
  mo.split = node::EvenSplit(3, 5);
  mo.kv_config.max_sessions = 1;
  InProcessMesh mesh(File(), mo, Pool());
  const RunOutput undisturbed = Generate(mesh, prompt, 40);
  ASSERT_EQ(undisturbed.re_prefills, 0);

  GenerateEvents ev;
  int seen = 0;
  ev.on_token = [&](int32_t) {
    // Mid-generation, another session takes the middle shard's only slot.
    if (++seen == 17) mesh.manager(1).Open("intruder", 0);
  };
  const RunOutput disturbed = Generate(mesh, prompt, 40, ev);
  EXPECT_EQ(disturbed.re_prefills, 1);
  EXPECT_EQ(disturbed.tokens, undisturbed.tokens);
  // Two LRU evictions on the middle shard: ours by the intruder, then the
  // intruder's by our re-prefill.
  EXPECT_EQ(mesh.manager(1).Stats().evictions[static_cast<int>(kv::CacheMissReason::kEvictedLru)],
            2);
  auto intruder = mesh.manager(1).Resolve("intruder", 0);
  ASSERT_TRUE(std::holds_alternative<kv::CacheMiss>(intruder));
  EXPECT_EQ(std::get<kv::CacheMiss>(intruder).reason, kv::CacheMissReason::kEvictedLru);
}

TEST(Generation, SeededSamplingIsReproducible) {
  const std::vector<int32_t> prompt = Prompt();
  InProcessMeshOptions mo;
  mo.split = node::EvenSplit(2, 5);
  InProcessMesh mesh(File(), mo, Pool());
  shard::SamplingContract s{0.9f, 40, 0.95f, 1234};
  const RunOutput a = Generate(mesh, prompt, 32, {}, s);
  const RunOutput b = Generate(mesh, prompt, 32, {}, s);
  s.seed = 99;
  const RunOutput c = Generate(mesh, prompt, 32, {}, s);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_NE(a.tokens, c.tokens);
}

// A long prompt sent in pipelined pieces (GenerateOptions::prefill_chunk)
// gives the tokens and, with float32 KV, the logits of the prompt sent whole,
// greedy and sampled, on splits into 2 and 3 shards (one shard takes it whole).
TEST(Generation, ChunkedPrefillGivesTheSameTokensAndLogits) {
  const auto tok = model::Tokenizer::FromGguf(*File());
  const std::vector<int32_t> prompt = tok.Encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends. One day, she saw a big red ball.",
      true);
  ASSERT_GT(prompt.size(), 30u);
  for (int shards = 2; shards <= 3; ++shards) {
    InProcessMeshOptions mo;
    mo.split = node::EvenSplit(shards, 5);
    mo.kv_dtype = KvDtype::kF32;
    InProcessMesh mesh(File(), mo, Pool());
    for (const shard::SamplingContract& s :
         {shard::SamplingContract{}, shard::SamplingContract{0.9f, 40, 0.95f, 7}}) {
      const RunOutput whole = Generate(mesh, prompt, 16, {}, s);
      for (int64_t chunk : {1, 7, 16}) {
        const RunOutput run = Generate(mesh, prompt, 16, {}, s, chunk);
        ASSERT_EQ(run.tokens, whole.tokens) << shards << " shards, chunk " << chunk;
        ASSERT_EQ(run.logits.size(), whole.logits.size());
        for (size_t t = 0; t < whole.logits.size(); ++t) {
          for (size_t i = 0; i < whole.logits[t].size(); ++i) {
            ASSERT_NEAR(run.logits[t][i], whole.logits[t][i], 1e-4)
                << shards << " shards, chunk " << chunk << ", token " << t;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace meshnet::mesh

namespace meshnet::mesh {
namespace {

// The tokens a greedy generation with `adjust` must produce, recomputed from
// the tail's raw logits rows: argmax of the row with OpenAI's penalties (over
// the tokens generated so far) and the bias applied.
std::vector<int32_t> ExpectedAdjusted(const RunOutput& run, const shard::LogitAdjustments& adjust) {
  std::vector<int32_t> counts(run.logits.empty() ? 0 : run.logits[0].size(), 0), seen, out;
  for (size_t i = 0; i < run.tokens.size(); ++i) {
    std::vector<float> row = run.logits[i];
    adjust.Apply(row, counts, seen);
    out.push_back(static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin()));
    if (counts[run.tokens[i]]++ == 0) seen.push_back(run.tokens[i]);
  }
  return out;
}

// A prefix cache hit (GenerateOptions::resume_length): a session kept after
// its generation (release_at_end false) continues a longer prompt that
// starts with part of its text; every hop is truncated to the shared part
// and only the rest is computed. Tokens and logits equal a fresh run's, on
// one hop and on three. A resume whose session the hops no longer hold
// prefills the whole prompt, with the same output.
TEST(Generation, ResumingAKeptSessionGivesTheFreshRunsOutput) {
  for (const int shards : {1, 3}) {
    InProcessMeshOptions mo;
    mo.split = node::EvenSplit(shards, 5);
    InProcessMesh mesh(File(), mo, Pool());
    FixedRouteProvider provider(mesh.route());
    GenerateOptions first;
    first.max_tokens = 12;
    first.session_id = "0123456789abcdef0123456789abcdef";
    first.session_secret = "the-secret";
    first.release_at_end = false;
    const GenerateResult kept = mesh::Generate(provider, Prompt(), first);
    // The hops hold the prompt and every generated token but the last.
    std::vector<int32_t> held = Prompt();
    held.insert(held.end(), kept.generated_ids.begin(), kept.generated_ids.end() - 1);
    ASSERT_EQ(kept.kv_tokens, held);
    ASSERT_EQ(kept.final_hops.size(), static_cast<size_t>(shards));
    // The next turn: 4 tokens of the kept text differ from what it held
    // (a template that rewrote the tail), then new text.
    std::vector<int32_t> next(held.begin(), held.end() - 4);
    for (const int32_t t : {261, 378, 429, 30, 31, 403, 407}) next.push_back(t);
    const auto common = static_cast<int64_t>(held.size()) - 4;
    const RunOutput fresh = Generate(mesh, next, 16);
    GenerateOptions again = first;
    again.max_tokens = 16;
    again.release_at_end = true;
    again.resume_length = common;
    RunOutput resumed;
    GenerateEvents ev;
    ev.on_logits = [&](std::span<const float> l) {
      resumed.logits.emplace_back(l.begin(), l.end());
    };
    const GenerateResult r = mesh::Generate(provider, next, again, ev);
    EXPECT_EQ(r.cached_tokens, common) << shards << " shards";
    EXPECT_EQ(r.re_prefills, 0);
    EXPECT_EQ(r.generated_ids, fresh.tokens) << shards << " shards";
    ASSERT_EQ(resumed.logits.size(), fresh.logits.size());
    for (size_t s = 0; s < fresh.logits.size(); ++s) {
      EXPECT_EQ(resumed.logits[s], fresh.logits[s]) << "step " << s << ", " << shards << " shards";
    }
    for (int i = 0; i < shards; ++i) EXPECT_EQ(mesh.node(i).manager().SessionCount(), 0);
    // Released at the end: a resume now finds nothing and prefills it all.
    const GenerateResult gone = mesh::Generate(provider, next, again);
    EXPECT_EQ(gone.cached_tokens, 0);
    EXPECT_EQ(gone.generated_ids, fresh.tokens);
  }
}

// Speculative decoding (GenerateOptions::speculate): prompt-lookup drafts
// verified by the tail in one pass give exactly the tokens of one-token
// steps, greedy and with seeded sampling, on one hop and on three; drafts
// are accepted and rejected along the way, and every hop ends holding
// exactly the kept text (the rejected drafts dropped).
TEST(Generation, SpeculationGivesThePlainTokens) {
  const std::vector<int32_t> prompt = Prompt();
  for (const int shards : {1, 3}) {
    InProcessMeshOptions mo;
    mo.split = node::EvenSplit(shards, 5);
    InProcessMesh mesh(File(), mo, Pool());
    for (const float temperature : {0.0f, 0.8f}) {
      shard::SamplingContract sampling;
      sampling.temperature = temperature;
      sampling.seed = 11;
      const RunOutput plain = Generate(mesh, prompt, 96, {}, sampling);
      FixedRouteProvider provider(mesh.route());
      GenerateOptions o;
      o.max_tokens = 96;
      o.sampling = sampling;
      o.speculate = 4;
      o.session_id = "0123456789abcdef0123456789abcdef";
      o.session_secret = "s";
      o.release_at_end = false;
      const GenerateResult r = mesh::Generate(provider, prompt, o);
      const std::string what =
          std::to_string(shards) + " shards, temperature " + std::to_string(temperature);
      EXPECT_EQ(r.generated_ids, plain.tokens) << what;
      EXPECT_GT(r.verify_steps, 0) << what;
      EXPECT_GT(r.accepted, 0) << what;
      EXPECT_LT(r.accepted, r.drafted) << what << ": no draft was rejected";
      for (int i = 0; i < shards; ++i) {
        auto& m = mesh.node(i).manager();
        EXPECT_EQ(m.Get(o.session_id, 0).seq_len(), static_cast<int64_t>(r.kv_tokens.size()))
            << what << ", hop " << i;
        m.Release(o.session_id, 0);
      }
    }
  }
}

// Drafts from a draft model (the shipped model, and its Q4_K_M quantization
// as a smaller, different one): the plain tokens, greedy and sampled; the
// model as its own draft is right about every greedy draft, the quantized
// one about many, and a draft model's session ends with the generation.
TEST(Generation, ADraftModelGivesThePlainTokens) {
  const std::vector<int32_t> prompt = Prompt();
  InProcessMeshOptions mo;
  mo.split = node::EvenSplit(3, 5);
  InProcessMesh mesh(File(), mo, Pool());
  const std::string quantized =
      std::string(MESHNET_SOURCE_DIR) + "/tests/data/quant/stories260K-Q4_K_M.gguf";
  for (const std::string& path : {kModel, quantized}) {
    auto draft = std::make_shared<DraftModel>(
        std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(path)), int64_t{16} << 20);
    for (const float temperature : {0.0f, 0.8f}) {
      shard::SamplingContract sampling;
      sampling.temperature = temperature;
      sampling.seed = 5;
      const RunOutput plain = Generate(mesh, prompt, 80, {}, sampling);
      FixedRouteProvider provider(mesh.route());
      GenerateOptions o;
      o.max_tokens = 80;
      o.sampling = sampling;
      o.speculate = 4;
      o.draft = draft;
      const GenerateResult r = mesh::Generate(provider, prompt, o);
      const std::string what = path + ", temperature " + std::to_string(temperature);
      EXPECT_EQ(r.generated_ids, plain.tokens) << what;
      EXPECT_GT(r.accepted, 0) << what;
      if (temperature == 0.0f && path == kModel) {
        EXPECT_EQ(r.accepted, r.drafted) << what << ": the model drafts its own greedy tokens";
        EXPECT_LE(r.verify_steps, 80 / 5 + 2) << what;
      }
    }
  }
}

// Drafts that are right up to a random point and wrong after it (none
// right, some, all), from a drafter that knows the plain run's text.
class PatternDrafter final : public Drafter {
 public:
  PatternDrafter(const std::vector<int32_t>* text, std::mt19937* rng) : text_(text), rng_(rng) {}
  void Propose(std::span<const int32_t> text, int k, std::vector<int32_t>* out) override {
    out->clear();
    const int right = static_cast<int>((*rng_)() % static_cast<uint32_t>(k + 1));
    for (int i = 0; i < k && text.size() + i < text_->size(); ++i) {
      int32_t t = (*text_)[text.size() + i];
      if (i >= right) t = (t + 1 + static_cast<int32_t>((*rng_)() % 200)) % 512;  // wrong
      out->push_back(t);
    }
  }

 private:
  const std::vector<int32_t>* text_;
  std::mt19937* rng_;
};

class PatternSource final : public DraftSource {
 public:
  PatternSource(const std::vector<int32_t>* text, std::mt19937* rng) : text_(text), rng_(rng) {}
  std::unique_ptr<Drafter> NewDrafter() override {
    return std::make_unique<PatternDrafter>(text_, rng_);
  }

 private:
  const std::vector<int32_t>* text_;
  std::mt19937* rng_;
};

// 2,000+ verify steps of random accept/reject patterns over 3 hops: every
// generation gives the plain tokens, and after it every hop holds exactly
// the kept text (no hop desynchronised by a rejection).
TEST(Generation, RandomAcceptAndRejectPatternsNeverDesynchroniseAHop) {
  InProcessMeshOptions mo;
  mo.split = node::EvenSplit(3, 5);
  InProcessMesh mesh(File(), mo, Pool());
  std::mt19937 rng(2026);
  int64_t steps = 0;
  for (int g = 0; g < 40 && steps < 2000; ++g) {
    std::vector<int32_t> prompt = Prompt();
    prompt.push_back(10 + g);
    shard::SamplingContract sampling;
    sampling.temperature = g % 2 == 0 ? 0.0f : 0.9f;
    sampling.seed = static_cast<uint64_t>(g);
    const RunOutput plain = Generate(mesh, prompt, 200, {}, sampling);
    std::vector<int32_t> text = prompt;
    text.insert(text.end(), plain.tokens.begin(), plain.tokens.end());
    FixedRouteProvider provider(mesh.route());
    GenerateOptions o;
    o.max_tokens = 200;
    o.sampling = sampling;
    o.speculate = 1 + g % 6;
    o.draft = std::make_shared<PatternSource>(&text, &rng);
    o.session_id = node::RandomId128();
    o.session_secret = "s";
    o.release_at_end = false;
    const GenerateResult r = mesh::Generate(provider, prompt, o);
    ASSERT_EQ(r.generated_ids, plain.tokens) << "generation " << g;
    for (int i = 0; i < 3; ++i) {
      auto& m = mesh.node(i).manager();
      ASSERT_EQ(m.Get(o.session_id, 0).seq_len(), static_cast<int64_t>(r.kv_tokens.size()))
          << "generation " << g << ", hop " << i;
      m.Release(o.session_id, 0);
    }
    steps += r.verify_steps;
    EXPECT_LT(r.accepted, r.drafted);
    EXPECT_GT(r.accepted, 0);
  }
  EXPECT_GE(steps, 2000);
}

// Penalties and bias are applied by the client to the tail's row: each token
// is the argmax of its adjusted row; the unadjusted run is unchanged.
TEST(Generation, PenaltiesAndBiasAreAppliedToEveryRow) {
  InProcessMeshOptions mo;
  mo.split = node::EvenSplit(3, 5);
  InProcessMesh mesh(File(), mo, Pool());
  const RunOutput plain = Generate(mesh, Prompt(), 48);
  FixedRouteProvider provider(mesh.route());
  for (shard::LogitAdjustments adjust :
       {shard::LogitAdjustments{2.0f, 0.0f, {}}, shard::LogitAdjustments{0.0f, 2.0f, {}},
        shard::LogitAdjustments{0.0f, 0.0f, {{300, 100.0f}}},
        shard::LogitAdjustments{-1.0f, 0.5f, {{432, -100.0f}}}}) {
    GenerateOptions o;
    o.max_tokens = 48;
    o.adjustments = adjust;
    RunOutput run;
    GenerateEvents ev;
    ev.on_logits = [&](std::span<const float> l) { run.logits.emplace_back(l.begin(), l.end()); };
    run.tokens = mesh::Generate(provider, Prompt(), o, ev).generated_ids;
    ASSERT_FALSE(run.tokens.empty());
    EXPECT_EQ(run.tokens, ExpectedAdjusted(run, adjust));
    EXPECT_NE(run.tokens, plain.tokens) << "the adjustment changed nothing";
    if (!adjust.bias.empty() && adjust.bias[0].second > 0) {
      EXPECT_EQ(std::count(run.tokens.begin(), run.tokens.end(), 300),
                static_cast<long>(run.tokens.size()));
    }
  }
  EXPECT_EQ(Generate(mesh, Prompt(), 48).tokens, plain.tokens);
}

}  // namespace
}  // namespace meshnet::mesh
