// The trace replay engine. Each op first performs, in the reference's order,
// the checks that live in seed_replay.py or that are pure input validation
// (argument presence and types, epoch, recipe compatibility by the reference's
// fingerprint, hashability), then calls the HotKvStateManager, which repeats
// the epoch / recipe checks and does everything stateful (stale epoch, TTL,
// live lookup, expected_seq_len, budget, LRU) itself.
//
// Appended rows follow the spec's formula. For each owned layer L and position
// p, K[p,h,d] = T[(c(L,p) + 7h) % 1000 + d] where T[i] = (i % 1000) / 1000
// rounded to the dtype (q8_0 / q4_0: T as float32, each head quantized) and
// c(L,p) = (fnv1a32(session) + 31 epoch + 131 L + 17 p)
// mod 1000 (computed mod 1000 term by term: exact for any int64 epoch); so a
// row is n_kv_heads memcpys from a table built once per config.
//
// The Append path needs the context's seq_len before the call (the reference
// peeks at mgr._sessions). seq_len_ records the seq_len every op returned for
// its key; it is exact for every live key, because only open / append /
// truncate change a live context and each of them reports the new length. A
// dead key's rows are never observed (the append misses).
#include "kvtrace/trace_replay.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <istream>
#include <new>
#include <ostream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "kv/hot_kv_state.h"
#include "kvtrace/trace_args.h"
#include "kvtrace/trace_json.h"
#include "ops/kv_quant.h"
#include "util/clock.h"
#include "util/hash.h"

namespace meshnet::kv {

using trace::JsonType;
using trace::JsonValue;

namespace {

constexpr std::string_view kInvalid = "{\"error\":\"invalid-argument\"}";
constexpr size_t kMaxScratchFloats = size_t{1} << 24;  // 64 MiB of rows per Append call

std::string_view ErrorName(ErrorKind kind) {
  // BoundaryContractError is a ValueError in the reference.
  if (kind == ErrorKind::kBoundaryContract) return ErrorKindName(ErrorKind::kInvalidArgument);
  return ErrorKindName(kind);
}

// n_kv_heads memcpys of a head's bytes from `table` (see the file comment),
// head h's from entry (c + 7h) % 1000, entries `stride` bytes apart.
void FillRow(uint8_t* dst, const uint8_t* table, size_t stride, size_t head_bytes, uint64_t c,
             int heads) {
  for (int h = 0; h < heads; ++h) {
    const uint64_t off = (c + 7 * static_cast<uint64_t>(h)) % 1000;
    std::memcpy(dst, table + off * stride, head_bytes);
    dst += head_bytes;
  }
}

}  // namespace

class TraceReplayer::Impl {
 public:
  explicit Impl(ReplayAppendPath path) : path_(path) {}
  ~Impl() { manager_.reset(); }

  bool Step(std::string_view line, std::string* out) {
    if (!trace::IsValidUtf8(line)) {
      Emit(out, kInvalid);
      return true;
    }
    if (trace::IsPyBlank(line)) return false;
    if (!doc_.Parse(line) || doc_.root().type != JsonType::kObject) {
      Emit(out, kInvalid);
      return true;
    }
    const JsonValue& op = doc_.root();
    if (const JsonValue* t = doc_.Find(op, "t")) {
      double now;
      if (!trace::ClockArg(*t, &now)) {  // the reference crashes here, before any state
        Emit(out, kInvalid);
        return true;
      }
      clock_.Set(now);
    }
    const JsonValue* kind_value = doc_.Find(op, "op");
    const std::string_view kind =
        kind_value != nullptr && kind_value->type == JsonType::kString ? kind_value->text : "";
    non_str_session_ = false;
    try {
      if (kind == "config") {
        Config(op, out);
      } else if (manager_ == nullptr) {
        Emit(out, kInvalid);  // "first op must be config"
      } else if (kind == "open") {
        Open(op, out);
      } else if (kind == "append") {
        Append(op, out);
      } else if (kind == "truncate") {
        Truncate(op, out);
      } else if (kind == "release") {
        Release(op, out);
      } else if (kind == "resolve" || kind == "get") {
        Lookup(op, kind == "get", out);
      } else if (kind == "stats") {
        Stats(out);
      } else {
        Emit(out, kInvalid);  // unknown op
      }
    } catch (const CacheMissError& e) {
      EmitCacheMiss(out, e.miss().reason);
    } catch (const Error& e) {
      out->append("{\"error\":\"").append(ErrorName(e.kind())).append("\"}\n");
    } catch (const std::bad_alloc&) {
      Emit(out, kInvalid);  // the reference raises MemoryError (and dies) here
    }
    return true;
  }

 private:
  static void Emit(std::string* out, std::string_view s) {
    out->append(s);
    out->push_back('\n');
  }
  // A raised miss formats the id with session_id[:8], which raises TypeError
  // for a non-str id: the reference then answers invalid-argument.
  void EmitCacheMiss(std::string* out, CacheMissReason r) {
    if (non_str_session_) return Emit(out, kInvalid);
    out->append("{\"error\":\"cache-miss\",\"reason\":\"")
        .append(CacheMissReasonName(r))
        .append("\"}\n");
  }
  static void EmitSeqLen(std::string* out, int64_t n) {
    out->append("{\"ok\":true,\"seq_len\":");
    trace::AppendInt(n, out);
    out->append("}\n");
  }
  void EmitIncompatible(std::string* out) {
    out->append("{\"error\":\"").append(ErrorName(ErrorKind::kIncompatibleRecipe)).append("\"}\n");
  }

  // An op's `recipe` (absent or null: none). False for invalid-argument.
  bool ReadOpRecipe(const JsonValue& op, const trace::TraceRecipe** recipe) {
    *recipe = nullptr;
    const JsonValue* r = doc_.Find(op, "recipe");
    if (r == nullptr || r->type == JsonType::kNull) return true;
    if (!trace::ParseTraceRecipe(doc_, *r, &op_recipe_)) return false;
    *recipe = &op_recipe_;
    return true;
  }
  bool Compatible(const trace::TraceRecipe* r) const {
    return r == nullptr || r->fingerprint == config_recipe_.fingerprint;
  }
  // The recipe to hand the manager; Compatible(r) holds, so r is storable.
  static const KvCacheRecipe* ManagerRecipe(const trace::TraceRecipe* r) {
    return r != nullptr ? &r->recipe : nullptr;
  }

  // The manager's id for a hashable session value.
  std::string_view SessionId(const JsonValue& v) {
    if (trace::SessionKeyArg(v, &session_scratch_) == trace::SessionKind::kStr) {
      return v.text;
    }
    non_str_session_ = true;
    return session_scratch_;
  }

  // --- seq_len_ (see the file comment) ---------------------------------------
  void KeyFor(std::string_view id, int64_t epoch) {
    key_scratch_.assign(id);
    key_scratch_.push_back('\xff');  // never inside a UTF-8 id
    key_scratch_.append(reinterpret_cast<const char*>(&epoch), sizeof(epoch));
  }
  int64_t KnownSeqLen(std::string_view id, int64_t epoch) {
    KeyFor(id, epoch);
    auto it = seq_len_.find(key_scratch_);
    return it == seq_len_.end() ? 0 : it->second;
  }
  void SetSeqLen(std::string_view id, int64_t epoch, int64_t n) {
    KeyFor(id, epoch);
    seq_len_[key_scratch_] = n;
    if (seq_len_.size() >= prune_at_) {  // keep only live keys; amortized O(1)
      std::unordered_set<std::string> live;
      for (const auto& [s, e] : manager_->SessionKeys()) {
        KeyFor(s, e);
        live.insert(key_scratch_);
      }
      std::erase_if(seq_len_, [&](const auto& kv) { return !live.contains(kv.first); });
      prune_at_ = std::max<size_t>(1024, 2 * seq_len_.size());
    }
  }

  // --- ops ---------------------------------------------------------------------
  void Config(const JsonValue& op, std::string* out) {
    const JsonValue* r = doc_.Find(op, "recipe");
    trace::TraceRecipe recipe;
    HotKvStateConfig config;
    if (r == nullptr || !trace::ParseTraceRecipe(doc_, *r, &recipe) ||
        !trace::ConfigArgs(doc_, op, &config) || !recipe.storable) {
      return Emit(out, kInvalid);  // a failed config keeps the previous manager
    }
    // Everything that can fail happens before the old manager is replaced.
    std::unique_ptr<HotKvStateManager> m;
    RowTables tables;
    try {
      m = std::make_unique<HotKvStateManager>(recipe.recipe, config, &clock_);
      tables = BuildTables(m->recipe());
    } catch (const Error&) {
      return Emit(out, kInvalid);
    } catch (const std::bad_alloc&) {
      return Emit(out, kInvalid);
    }
    manager_ = std::move(m);
    tables_ = std::move(tables);
    config_recipe_ = recipe;
    seq_len_.clear();
    const KvCacheRecipe& mr = manager_->recipe();
    const JsonValue* heads = doc_.Find(*r, "n_kv_heads");
    const JsonValue* dim = doc_.Find(*r, "head_dim");
    // With int geometry the manager's own fingerprint must equal the
    // reference's; bool or float geometry prints differently in Python.
    const bool plain = heads->type == JsonType::kInt && dim->type == JsonType::kInt;
    out->append("{\"ok\":true,\"fingerprint\":\"")
        .append(plain ? mr.Fingerprint() : recipe.fingerprint)
        .append("\",\"bytes_per_token\":");
    if (recipe.float_bytes_per_token) {
      trace::AppendPyFloatRepr(recipe.bytes_per_token, out);
    } else {
      trace::AppendInt(mr.BytesPerToken(), out);
    }
    out->append("}\n");
  }

  // Row tables: (1000 + head_dim) entries of (i % 1000) / 1000 and its
  // negation; for q8_0 / q4_0 the store tables hold instead the 1000 heads
  // that start at each entry, quantized (the double values rounded to float
  // first).
  struct RowTables {
    std::vector<float> k_f32, v_f32;        // float32, for Append's LayerKv
    std::vector<uint8_t> k_store, v_store;  // in the kv dtype, for KvStep rows
    size_t stride = 0;                      // bytes between store entries
    size_t head_bytes = 0;
  };
  static RowTables BuildTables(const KvCacheRecipe& r) {
    RowTables t;
    const size_t n = 1000 + static_cast<size_t>(r.head_dim);
    const size_t item = KvDtypeSize(r.kv_dtype);
    t.head_bytes = static_cast<size_t>(KvHeadBytes(r.kv_dtype, r.head_dim));
    t.stride = IsQuantizedKv(r.kv_dtype) ? t.head_bytes : item;
    t.k_f32.resize(n);
    t.v_f32.resize(n);
    t.k_store.resize(IsQuantizedKv(r.kv_dtype) ? 1000 * t.head_bytes : n * item);
    t.v_store.resize(t.k_store.size());
    for (size_t i = 0; i < n; ++i) {
      const double k = static_cast<double>(i % 1000) / 1000.0;
      t.k_f32[i] = static_cast<float>(k);
      t.v_f32[i] = static_cast<float>(-k);
      if (IsQuantizedKv(r.kv_dtype)) continue;  // below, once the floats are there
      if (r.kv_dtype == KvDtype::kF16) {        // correctly rounded straight from double
        const uint16_t hk = DoubleToHalf(k), hv = DoubleToHalf(-k);
        std::memcpy(&t.k_store[i * 2], &hk, 2);
        std::memcpy(&t.v_store[i * 2], &hv, 2);
      } else {
        StoreAs(r.kv_dtype, &t.k_store[i * item], t.k_f32[i]);
        StoreAs(r.kv_dtype, &t.v_store[i * item], t.v_f32[i]);
      }
    }
    if (IsQuantizedKv(r.kv_dtype)) {
      for (size_t i = 0; i < 1000; ++i) {
        ops::QuantizeKvHead(r.kv_dtype, &t.k_f32[i], r.head_dim, &t.k_store[i * t.head_bytes]);
        ops::QuantizeKvHead(r.kv_dtype, &t.v_f32[i], r.head_dim, &t.v_store[i * t.head_bytes]);
      }
    }
    return t;
  }

  void Open(const JsonValue& op, std::string* out) {
    const trace::TraceRecipe* recipe;
    if (!ReadOpRecipe(op, &recipe)) return Emit(out, kInvalid);
    const JsonValue* session = doc_.Find(op, "session");
    const JsonValue* epoch_v = doc_.Find(op, "epoch");
    int64_t epoch;
    if (session == nullptr || epoch_v == nullptr || session->type != JsonType::kString ||
        trace::IsPyBlank(session->text) || !trace::NonNegativeIntArg(*epoch_v, &epoch)) {
      return Emit(out, kInvalid);
    }
    if (!Compatible(recipe)) return EmitIncompatible(out);
    const SessionHandle h = manager_->Open(session->text, epoch, ManagerRecipe(recipe));
    SetSeqLen(session->text, epoch, h.seq_len());
    EmitSeqLen(out, h.seq_len());
  }

  void Append(const JsonValue& op, std::string* out) {
    const trace::TraceRecipe* recipe;
    if (!ReadOpRecipe(op, &recipe)) return Emit(out, kInvalid);
    const JsonValue* tokens_v = doc_.Find(op, "tokens");
    const JsonValue* session = doc_.Find(op, "session");
    const JsonValue* epoch_v = doc_.Find(op, "epoch");
    int64_t tokens, epoch;
    // tokens check, op["session"] / op["epoch"], hashing (sid, epoch), str(sid)
    // UTF-8 encoding in fnv1a32, then the manager's epoch check: all ValueError,
    // TypeError or KeyError before anything stateful.
    if (tokens_v == nullptr || !trace::NonNegativeIntArg(*tokens_v, &tokens) ||
        session == nullptr || epoch_v == nullptr || !session->hashable() || !epoch_v->hashable() ||
        (session->type == JsonType::kString && trace::HasLoneSurrogate(session->text)) ||
        !trace::NonNegativeIntArg(*epoch_v, &epoch)) {
      return Emit(out, kInvalid);
    }
    if (!Compatible(recipe)) return EmitIncompatible(out);
    const std::string_view id = SessionId(*session);
    const auto expected = trace::ExpectedSeqLenArg(doc_.Find(op, "expected_seq_len"));
    const KvCacheRecipe& r = manager_->recipe();
    const int64_t bpt = r.BytesPerToken();
    if (tokens > (int64_t{1} << 62) / bpt) return Emit(out, kInvalid);  // MemoryError there
    const int64_t fit = manager_->config().budget_bytes / bpt;  // most tokens one session holds
    const unsigned __int128 floats = static_cast<unsigned __int128>(tokens) * 2 *
                                     r.num_owned_layers() * r.n_kv_heads * r.head_dim;
    if (path_ == ReplayAppendPath::kAppend && tokens <= fit && floats <= kMaxScratchFloats) {
      return AppendRows(id, epoch, tokens, ManagerRecipe(recipe), expected, out);
    }
    // An append that cannot fit even alone needs no rows: it fails (budget or
    // an earlier check) whatever their count beyond `fit`.
    StepRows(id, epoch, std::min(tokens, fit + 1), tokens, ManagerRecipe(recipe), expected, out);
  }

  uint64_t RowBase(std::string_view id, int64_t epoch) const {
    return (Fnv1a32(id) % 1000 + 31 * static_cast<uint64_t>(epoch % 1000)) % 1000;
  }
  static uint64_t RowC(uint64_t base, int layer, int64_t pos) {
    return (base + 131 * static_cast<uint64_t>(layer % 1000) +
            17 * static_cast<uint64_t>(pos % 1000)) %
           1000;
  }

  void AppendRows(std::string_view id, int64_t epoch, int64_t tokens, const KvCacheRecipe* recipe,
                  std::optional<int64_t> expected, std::string* out) {
    const KvCacheRecipe& r = manager_->recipe();
    const int64_t start = KnownSeqLen(id, epoch);
    const size_t row = static_cast<size_t>(r.n_kv_heads) * r.head_dim;
    const size_t plane = static_cast<size_t>(tokens) * row;  // (tokens, n_kv_heads, head_dim)
    scratch_.resize(2 * plane * r.num_owned_layers());
    layer_kv_.resize(r.num_owned_layers());
    const uint64_t base = RowBase(id, epoch);
    for (int i = 0; i < r.num_owned_layers(); ++i) {
      const int layer = r.start_layer + i;
      float* k = scratch_.data() + 2 * plane * i;
      float* v = k + plane;
      for (int64_t t = 0; t < tokens; ++t) {
        const uint64_t c = RowC(base, layer, start + t);
        const size_t head = 4 * static_cast<size_t>(r.head_dim);
        FillRow(reinterpret_cast<uint8_t*>(k + t * row),
                reinterpret_cast<const uint8_t*>(tables_.k_f32.data()), 4, head, c, r.n_kv_heads);
        FillRow(reinterpret_cast<uint8_t*>(v + t * row),
                reinterpret_cast<const uint8_t*>(tables_.v_f32.data()), 4, head, c, r.n_kv_heads);
      }
      layer_kv_[i] = LayerKv{layer, tokens, {k, plane}, {v, plane}};
    }
    const int64_t n = manager_->Append(id, epoch, layer_kv_, recipe, expected);
    SetSeqLen(id, epoch, n);
    EmitSeqLen(out, n);
  }

  void StepRows(std::string_view id, int64_t epoch, int64_t n_new, int64_t tokens,
                const KvCacheRecipe* recipe, std::optional<int64_t> expected, std::string* out) {
    StepResult result = manager_->BeginStep(id, epoch, n_new, recipe, expected);
    if (const CacheMiss* miss = std::get_if<CacheMiss>(&result)) {
      return EmitCacheMiss(out, miss->reason);
    }
    KvStep& step = std::get<KvStep>(result);
    if (n_new != tokens) {
      throw std::logic_error("kv replay: the manager reserved more than its byte budget");
    }
    const KvCacheRecipe& r = manager_->recipe();
    const uint64_t base = RowBase(id, epoch);
    for (int layer = r.start_layer; layer <= r.end_layer; ++layer) {
      const ops::PagedKvLayer view = step.Layer(layer);
      for (int64_t pos = step.start_pos(); pos < step.start_pos() + n_new; ++pos) {
        const uint64_t c = RowC(base, layer, pos);
        FillRow(view.KRow(pos), tables_.k_store.data(), tables_.stride, tables_.head_bytes, c,
                r.n_kv_heads);
        FillRow(view.VRow(pos), tables_.v_store.data(), tables_.stride, tables_.head_bytes, c,
                r.n_kv_heads);
      }
    }
    const int64_t n = step.start_pos() + n_new;
    if (std::optional<CacheMiss> miss = step.Commit()) return EmitCacheMiss(out, miss->reason);
    SetSeqLen(id, epoch, n);
    EmitSeqLen(out, n);
  }

  void Truncate(const JsonValue& op, std::string* out) {
    const JsonValue* session = doc_.Find(op, "session");
    const JsonValue* epoch_v = doc_.Find(op, "epoch");
    const JsonValue* length = doc_.Find(op, "length");
    int64_t epoch;
    if (session == nullptr || epoch_v == nullptr || length == nullptr ||
        !trace::NonNegativeIntArg(*epoch_v, &epoch) || !session->hashable()) {
      return Emit(out, kInvalid);
    }
    const std::string_view id = SessionId(*session);
    // A negative / non-numeric length is refused by the manager after the lookup.
    const int64_t n = manager_->Truncate(id, epoch, trace::TruncateLengthArg(*length));
    SetSeqLen(id, epoch, n);
    EmitSeqLen(out, n);
  }

  void Release(const JsonValue& op, std::string* out) {
    const JsonValue* session = doc_.Find(op, "session");
    const JsonValue* epoch_v = doc_.Find(op, "epoch");
    int64_t epoch;
    if (session == nullptr || epoch_v == nullptr || !trace::NonNegativeIntArg(*epoch_v, &epoch) ||
        !session->hashable()) {
      return Emit(out, kInvalid);
    }
    const std::string_view id = SessionId(*session);
    const bool released = manager_->Release(id, epoch);
    KeyFor(id, epoch);
    seq_len_.erase(key_scratch_);
    out->append(released ? "{\"ok\":true,\"released\":true}\n"
                         : "{\"ok\":true,\"released\":false}\n");
  }

  void Lookup(const JsonValue& op, bool strict, std::string* out) {
    const JsonValue* session = doc_.Find(op, "session");
    const JsonValue* epoch_v = doc_.Find(op, "epoch");
    const trace::TraceRecipe* recipe;
    int64_t epoch;
    if (session == nullptr || epoch_v == nullptr || !ReadOpRecipe(op, &recipe) ||
        !trace::NonNegativeIntArg(*epoch_v, &epoch)) {
      return Emit(out, kInvalid);
    }
    if (!Compatible(recipe)) return EmitIncompatible(out);
    if (!session->hashable()) return Emit(out, kInvalid);  // hashing in the stale check
    const std::string_view id = SessionId(*session);
    const auto expected = trace::ExpectedSeqLenArg(doc_.Find(op, "expected_seq_len"));
    if (strict) {
      const SessionHandle h = manager_->Get(id, epoch, ManagerRecipe(recipe), expected);
      return EmitLive(h, out);
    }
    const ResolveResult result = manager_->Resolve(id, epoch, ManagerRecipe(recipe), expected);
    if (const CacheMiss* miss = std::get_if<CacheMiss>(&result)) {
      out->append("{\"miss\":\"").append(CacheMissReasonName(miss->reason)).append("\"}\n");
      return;
    }
    EmitLive(std::get<SessionHandle>(result), out);
  }

  // {"ok":true,"seq_len":n,"checksum":C}: sha256 over the owned layers in
  // ascending order, K then V, little-endian float32; first 16 hex digits.
  void EmitLive(const SessionHandle& h, std::string* out) {
    Sha256 sha;
    const KvCacheRecipe& r = manager_->recipe();
    for (int layer = r.start_layer; layer <= r.end_layer; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        std::vector<float> rows = kv == 0 ? h.ReadKeys(layer) : h.ReadValues(layer);
        if constexpr (std::endian::native == std::endian::big) {
          for (float& f : rows) f = BitsFloat(__builtin_bswap32(FloatBits(f)));
        }
        sha.Update(rows.data(), rows.size() * sizeof(float));
      }
    }
    out->append("{\"ok\":true,\"seq_len\":");
    trace::AppendInt(h.seq_len(), out);
    out->append(",\"checksum\":\"").append(sha.HexDigest().substr(0, 16)).append("\"}\n");
  }

  void Stats(std::string* out) {
    const int64_t count = manager_->SessionCount();  // evicts expired first
    out->append("{\"ok\":true,\"sessions\":");
    trace::AppendInt(count, out);
    out->append(",\"total_bytes\":");
    trace::AppendInt(manager_->TotalBytes(), out);
    out->append(",\"keys\":[");
    bool first = true;
    for (const auto& [id, epoch] : manager_->SessionKeys()) {
      out->append(first ? "[" : ",[");
      first = false;
      trace::AppendPyJsonString(id, out);
      out->push_back(',');
      trace::AppendInt(epoch, out);
      out->push_back(']');
    }
    out->append("]}\n");
  }

  const ReplayAppendPath path_;
  FakeClock clock_;  // declared before manager_: the manager reads it until destroyed
  std::unique_ptr<HotKvStateManager> manager_;
  trace::TraceRecipe config_recipe_;
  trace::TraceRecipe op_recipe_;
  trace::JsonDocument doc_;
  std::string session_scratch_;
  bool non_str_session_ = false;  // this op's session id is not a str
  RowTables tables_;
  std::vector<float> scratch_;  // per owned layer: K then V (tokens, heads, dim)
  std::vector<LayerKv> layer_kv_;
  std::unordered_map<std::string, int64_t> seq_len_;
  size_t prune_at_ = 1024;
  std::string key_scratch_;
};

TraceReplayer::TraceReplayer(ReplayAppendPath path) : impl_(std::make_unique<Impl>(path)) {}
TraceReplayer::~TraceReplayer() = default;

std::string TraceReplayer::Step(std::string_view line) {
  std::string out;
  if (!impl_->Step(line, &out)) return out;
  out.pop_back();
  return out;
}

bool TraceReplayer::StepInto(std::string_view line, std::string* out) {
  return impl_->Step(line, out);
}

int ReplayStream(std::istream& in, std::ostream& out, ReplayAppendPath path) {
  TraceReplayer replayer(path);
  std::vector<char> chunk(1 << 20);
  std::string line, results;
  bool after_cr = false;  // a '\n' right after '\r' ends nothing more
  bool too_long = false;  // this line passed kMaxTraceLineBytes: dropped
  auto flush = [&] {
    out.write(results.data(), static_cast<std::streamsize>(results.size()));
    results.clear();
  };
  auto take = [&](const char* p, size_t len) {
    if (too_long) return;
    if (line.size() + len > kMaxTraceLineBytes) {
      too_long = true;
      std::string().swap(line);  // give the memory back
      return;
    }
    line.append(p, len);
  };
  auto end_line = [&] {
    if (too_long) {
      results += "{\"error\":\"invalid-argument\"}\n";  // like any line that is not an op
      too_long = false;
    } else {
      replayer.StepInto(line, &results);
    }
    line.clear();
  };
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    const size_t n = static_cast<size_t>(in.gcount());
    if (n == 0) break;
    size_t i = 0;
    while (i < n) {
      if (after_cr && chunk[i] == '\n') ++i;
      after_cr = false;
      size_t j = i;
      while (j < n && chunk[j] != '\n' && chunk[j] != '\r') ++j;
      take(chunk.data() + i, j - i);
      if (j == n) break;
      after_cr = chunk[j] == '\r';
      end_line();
      i = j + 1;
      if (results.size() >= (1 << 16)) flush();
    }
  }
  if (in.bad()) return 1;
  if (!line.empty() || too_long) end_line();
  flush();
  out.flush();
  return out.fail() ? 1 : 0;
}

}  // namespace meshnet::kv
