// Session export / import between two NodeCores on the shipped stories260K
// model: a round trip gives bit-identical logits for every later step, and
// every kind of mismatch or corruption is refused with nothing loaded.
#include "node/migration.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "gguf/gguf_reader.h"
#include "node/identity.h"
#include "node/node.h"
#include "node/node_core.h"
#include "node/node_test_util.h"

namespace meshnet::node {
namespace {

std::shared_ptr<const gguf::GgufFile> File() { return ShippedFile(); }

const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378, 429, 30, 31, 32, 33};
const std::string kSecret = "the-secret";

StepRequest Request(const std::string& id, std::vector<int32_t> tokens, bool prefill,
                    int64_t held) {
  StepRequest r;
  r.session_id = id;
  r.session_secret = kSecret;
  r.prefill = prefill;
  if (!prefill) r.expected_seq_len = held;
  r.token_ids = std::move(tokens);
  return r;
}

const shard::TailOutput& Tail(const StepReply& r) { return std::get<shard::TailOutput>(r.result); }

// One node of layers 0..4 (head and tail) with its core.
struct TestNode {
  explicit TestNode(KvDtype dtype = KvDtype::kF32, int64_t budget = 16 << 20, int layers_end = 4,
                    int block_tokens = 4) {
    NodeOptions o;
    o.layers = LayerRange{0, layers_end};
    o.kv_dtype = dtype;
    o.kv_config.budget_bytes = budget;
    o.kv_config.block_tokens = block_tokens;
    node = std::make_unique<Node>(File(), o, nullptr);
    core = std::make_unique<NodeCore>(node.get());
  }
  std::unique_ptr<Node> node;
  std::unique_ptr<NodeCore> core;
};

struct Export {
  SessionExportHeader header;
  std::vector<KvChunk> chunks;
  ExportTrailer trailer;
};

Export Read(NodeCore& core, const std::string& id) {
  std::unique_ptr<SessionExporter> exp = core.BeginExport(id, &kSecret);
  Export e{exp->header(), {}, {}};
  KvChunk c;
  while (exp->Next(&c)) e.chunks.push_back(c);
  e.trailer = exp->trailer();
  return e;
}

// Imports `e` into `core` (all-or-nothing); returns the positions loaded.
int64_t Import(NodeCore& core, Export e) {
  std::unique_ptr<SessionImporter> imp = core.BeginImport(e.header);
  for (KvChunk& c : e.chunks) imp->Add(c);
  imp->Finish(e.trailer);
  return core.CommitImport(*imp);
}

// A session of kPrompt plus 3 decoded tokens on `n`; returns its id and the
// last token.
std::pair<std::string, int32_t> Prepared(TestNode& n) {
  const std::string id = RandomId128();
  int32_t t = Tail(n.core->Step(Request(id, kPrompt, true, 0))).token_id;
  for (int64_t held = static_cast<int64_t>(kPrompt.size()); held < 13; ++held) {
    t = Tail(n.core->Step(Request(id, {t}, false, held))).token_id;
  }
  return {id, t};
}

void ExpectNothingLoaded(TestNode& n) {
  EXPECT_EQ(n.core->manager().SessionCount(), 0);
  EXPECT_EQ(n.core->bindings(), 0);
  EXPECT_EQ(n.core->counters().sessions_imported.load(), 0);
}

TEST(Migration, RoundTripGivesBitIdenticalLogits) {
  TestNode a, b(KvDtype::kF32, 16 << 20, 4, /*block_tokens=*/3);  // other paging
  auto [id, t] = Prepared(a);
  const Export e = Read(*a.core, id);
  EXPECT_EQ(e.header.seq_len, 13);
  EXPECT_EQ(e.header.secret_sha256.size(), 32u);
  EXPECT_EQ(e.header.secret_sha256.find(kSecret), std::string::npos);
  EXPECT_EQ(Import(*b.core, e), 13);
  EXPECT_EQ(b.core->counters().import_chunks_verified.load(), e.header.n_chunks);
  int32_t ta = t, tb = t;
  for (int64_t held = 13; held < 20; ++held) {
    const StepReply ra = a.core->Step(Request(id, {ta}, false, held));
    const StepReply rb = b.core->Step(Request(id, {tb}, false, held));
    ASSERT_EQ(Tail(ra).logits, Tail(rb).logits) << "position " << held;
    ta = Tail(ra).token_id;
    tb = Tail(rb).token_id;
  }
  EXPECT_EQ(b.core->counters().prefill_tokens.load(), 0);
  // The binding moved with it: another secret is refused on the importer.
  StepRequest other = Request(id, {tb}, false, 20);
  other.session_secret = "another";
  EXPECT_THROW(b.core->Step(other), Error);
}

// The import's rows are reserved in the KV manager when it begins (counted
// against the budget, as a prefill's), written as chunks arrive, published
// only by CommitImport; an importer dropped half way leaves nothing.
TEST(Migration, AnImportReservesItsRowsAtOnceAndAnAbandonedOneLeavesNothing) {
  TestNode a;
  auto [id, t] = Prepared(a);
  const Export e = Read(*a.core, id);
  TestNode b;
  const int64_t reserved = e.header.seq_len * e.header.bytes_per_token;
  {
    std::unique_ptr<SessionImporter> imp = b.core->BeginImport(e.header);
    EXPECT_GE(b.core->manager().TotalBytes(), reserved);
    imp->Add(e.chunks[0]);  // written, never finished
    // A second import of the same session is refused while this one holds it.
    try {
      b.core->BeginImport(e.header);
      ADD_FAILURE() << "a second import of a claimed session began";
    } catch (const Error& err) {
      EXPECT_EQ(err.kind(), ErrorKind::kSessionBusy) << err.what();
    }
  }
  ExpectNothingLoaded(b);
  EXPECT_EQ(b.core->manager().TotalBytes(), 0);
  // The same node then takes the whole import.
  EXPECT_EQ(Import(*b.core, e), e.header.seq_len);
  EXPECT_GE(b.core->manager().TotalBytes(), reserved);
  EXPECT_EQ(b.core->counters().sessions_imported.load(), 1);
}

TEST(Migration, MovedSessionIsAnsweredWithItsNewAddress) {
  TestNode a;
  auto [id, t] = Prepared(a);
  {
    auto exp = a.core->BeginExport(id, nullptr);
    a.core->MarkMoved(id, "127.0.0.1:7777");
  }
  EXPECT_EQ(a.core->UntoldMoves(), 1);
  const StepReply r = a.core->Step(Request(id, {t}, false, 13));
  const auto& miss = std::get<kv::CacheMiss>(r.result);
  EXPECT_EQ(miss.reason, kv::CacheMissReason::kMoved);
  EXPECT_EQ(miss.moved_to, "127.0.0.1:7777");
  EXPECT_EQ(a.core->UntoldMoves(), 0);
  EXPECT_EQ(a.core->manager().SessionCount(), 0);
  a.core->StartDraining();
  try {
    a.core->Step(Request(RandomId128(), kPrompt, true, 0));
    ADD_FAILURE() << "a draining node took a new session";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("draining"), std::string::npos);
  }
}

TEST(Migration, ExportNeedsTheSessionsSecret) {
  TestNode a;
  auto [id, t] = Prepared(a);
  const std::string wrong = "wrong";
  try {
    a.core->BeginExport(id, &wrong);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied);
  }
}

struct Mismatch {
  const char* name;
  ErrorKind kind;
  std::function<void(Export&)> spoil;
};

TEST(Migration, EveryMismatchIsRefusedWithNothingLoaded) {
  TestNode a;
  auto [id, t] = Prepared(a);
  const Export good = Read(*a.core, id);
  ASSERT_GE(good.chunks.size(), 1u);
  const std::vector<Mismatch> cases = {
      {"model", ErrorKind::kIncompatibleRecipe, [](Export& e) { e.header.model_id[0] ^= 1; }},
      {"architecture", ErrorKind::kIncompatibleRecipe,
       [](Export& e) { e.header.architecture = "qwen2"; }},
      {"range", ErrorKind::kIncompatibleRecipe, [](Export& e) { e.header.start_layer = 1; }},
      {"total layers", ErrorKind::kIncompatibleRecipe, [](Export& e) { e.header.total_layers++; }},
      {"recipe", ErrorKind::kIncompatibleRecipe,
       [](Export& e) { e.header.recipe_fingerprint[0] ^= 1; }},
      {"dtype", ErrorKind::kIncompatibleRecipe,
       [](Export& e) { e.header.kv_dtype = KvDtype::kF16; }},
      {"heads", ErrorKind::kIncompatibleRecipe, [](Export& e) { e.header.n_kv_heads++; }},
      {"bytes per token", ErrorKind::kIncompatibleRecipe,
       [](Export& e) { e.header.bytes_per_token--; }},
      {"session id", ErrorKind::kInvalidArgument, [](Export& e) { e.header.session_id = "x"; }},
      {"binding", ErrorKind::kInvalidArgument, [](Export& e) { e.header.secret_sha256 = "s"; }},
      {"seq_len", ErrorKind::kInvalidArgument, [](Export& e) { e.header.seq_len = 1 << 20; }},
      {"chunking", ErrorKind::kInvalidArgument, [](Export& e) { e.header.n_chunks++; }},
      {"flipped byte", ErrorKind::kInvalidArgument, [](Export& e) { e.chunks[0].data[5] ^= 4; }},
      {"short chunk", ErrorKind::kInvalidArgument, [](Export& e) { e.chunks[0].data.pop_back(); }},
      {"chunk order", ErrorKind::kInvalidArgument, [](Export& e) { e.chunks[0].index = 1; }},
      {"missing chunk", ErrorKind::kInvalidArgument, [](Export& e) { e.chunks.pop_back(); }},
      {"digest", ErrorKind::kInvalidArgument, [](Export& e) { e.trailer.session_digest ^= 1; }},
      {"epoch in digest", ErrorKind::kInvalidArgument, [](Export& e) { e.header.route_epoch++; }},
  };
  for (const Mismatch& m : cases) {
    TestNode b;
    Export e = good;
    m.spoil(e);
    try {
      Import(*b.core, e);
      ADD_FAILURE() << m.name << ": accepted";
    } catch (const Error& err) {
      EXPECT_EQ(err.kind(), m.kind) << m.name << ": " << err.what();
    }
    ExpectNothingLoaded(b);
  }
}

TEST(Migration, OtherKvDtypeRangeOrTooSmallBudgetIsRefused) {
  TestNode a;
  auto [id, t] = Prepared(a);
  const Export e = Read(*a.core, id);
  TestNode f16(KvDtype::kF16);
  EXPECT_THROW(Import(*f16.core, e), Error);
  ExpectNothingLoaded(f16);
  TestNode shorter(KvDtype::kF32, 16 << 20, 3);
  EXPECT_THROW(Import(*shorter.core, e), Error);
  ExpectNothingLoaded(shorter);
  TestNode tiny(KvDtype::kF32, e.header.bytes_per_token * 8);
  try {
    Import(*tiny.core, e);
    ADD_FAILURE();
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kBudgetExceeded) << err.what();
  }
  ExpectNothingLoaded(tiny);
  TestNode draining;
  draining.core->StartDraining();
  EXPECT_THROW(Import(*draining.core, e), Error);
  ExpectNothingLoaded(draining);
}

// The rows of session `id` (epoch 0) on `n`: per owned layer, K rows then V
// rows of every position, as stored.
std::string StoredRows(TestNode& n, const std::string& id) {
  const kv::SessionHandle h = n.core->manager().Get(id, 0);
  const kv::KvCacheRecipe& r = n.core->manager().recipe();
  std::string out;
  for (int layer = r.start_layer; layer <= r.end_layer; ++layer) {
    const ops::PagedKvLayer v = h.Layer(layer);
    for (int64_t p = 0; p < h.seq_len(); ++p)
      out.append(reinterpret_cast<const char*>(v.KRow(p)), v.row_bytes);
    for (int64_t p = 0; p < h.seq_len(); ++p)
      out.append(reinterpret_cast<const char*>(v.VRow(p)), v.row_bytes);
  }
  return out;
}

// A q8_0 (q4_0) session moves to a node of its dtype with other paging as it
// is: the chunks are its blocks byte for byte as the source stores them (per
// chunk, per layer K then V), the importer stores exactly those bytes (no
// re-quantization), and later steps give bit-identical logits.
TEST(Migration, QuantizedKvMovesAsItIs) {
  for (KvDtype dt : {KvDtype::kQ8_0, KvDtype::kQ4_0}) {
    SCOPED_TRACE(KvDtypeName(dt));
    TestNode a(dt), b(dt, 16 << 20, 4, /*block_tokens=*/3);
    auto [id, t] = Prepared(a);
    const Export e = Read(*a.core, id);
    EXPECT_EQ(e.header.kv_dtype, dt);
    EXPECT_EQ(e.header.bytes_per_token, a.core->manager().recipe().BytesPerToken());
    const std::string rows = StoredRows(a, id);
    const int64_t row = e.header.row_bytes(), layers = e.header.num_layers();
    int64_t total = 0;
    for (const KvChunk& c : e.chunks) {
      ASSERT_EQ(static_cast<int64_t>(c.data.size()), 2 * layers * c.n_positions * row);
      for (int64_t l = 0; l < layers; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
          const size_t src =
              static_cast<size_t>(((2 * l + kv) * e.header.seq_len + c.first_position) * row);
          const size_t dst = static_cast<size_t>((2 * l + kv) * c.n_positions * row);
          ASSERT_EQ(c.data.compare(dst, static_cast<size_t>(c.n_positions * row), rows, src,
                                   static_cast<size_t>(c.n_positions * row)),
                    0)
              << "chunk " << c.index << " layer " << l << (kv == 0 ? " K" : " V");
        }
      }
      total += static_cast<int64_t>(c.data.size());
    }
    EXPECT_EQ(total, e.header.seq_len * e.header.bytes_per_token);
    EXPECT_EQ(Import(*b.core, e), 13);
    EXPECT_EQ(StoredRows(b, id), rows);
    int32_t ta = t, tb = t;
    for (int64_t held = 13; held < 18; ++held) {
      const StepReply ra = a.core->Step(Request(id, {ta}, false, held));
      const StepReply rb = b.core->Step(Request(id, {tb}, false, held));
      ASSERT_EQ(Tail(ra).logits, Tail(rb).logits) << "position " << held;
      ta = Tail(ra).token_id;
      tb = Tail(rb).token_id;
    }
  }
}

// A q8_0 session offered to an f16 or a q4_0 node is refused, naming both
// dtypes, with nothing loaded; and an f16 one to a q8_0 node.
TEST(Migration, AQuantizedSessionIsRefusedByANodeOfAnotherDtype) {
  TestNode q8(KvDtype::kQ8_0), f16(KvDtype::kF16), q4(KvDtype::kQ4_0);
  auto [id, t] = Prepared(q8);
  const Export e = Read(*q8.core, id);
  for (TestNode* target : {&f16, &q4}) {
    try {
      Import(*target->core, e);
      ADD_FAILURE() << "accepted";
    } catch (const Error& err) {
      EXPECT_EQ(err.kind(), ErrorKind::kIncompatibleRecipe);
      EXPECT_NE(std::string(err.what()).find("KV dtype differs (exported q8_0, this node "),
                std::string::npos)
          << err.what();
    }
    ExpectNothingLoaded(*target);
  }
  auto [id16, t16] = Prepared(f16);
  const Export e16 = Read(*f16.core, id16);
  TestNode q8b(KvDtype::kQ8_0);
  EXPECT_THROW(Import(*q8b.core, e16), Error);
  ExpectNothingLoaded(q8b);
}

}  // namespace
}  // namespace meshnet::node
