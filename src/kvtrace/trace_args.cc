// Python semantics of trace op arguments. Every rule here cites the reference
// expression it reproduces (seed_replay.py and meshnet_node/hot_kv_state.py).
#include "kvtrace/trace_args.h"

#include <cmath>
#include <cstdio>

#include "util/hash.h"

namespace meshnet::kv::trace {

namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr double kTwo63 = 9223372036854775808.0;

// Python's `v < k` / `v <= k` for a bool, int or float v and a small int k.
bool PyLess(const JsonValue& v, int64_t k) {
  switch (v.type) {
    case JsonType::kBool:
      return (v.boolean ? 1 : 0) < k;
    case JsonType::kInt:
      return v.integer < k;  // big ints are clamped, sign kept
    default:
      return v.number < static_cast<double>(k);  // NaN compares false
  }
}
bool PyLessEq(const JsonValue& v, int64_t k) {
  switch (v.type) {
    case JsonType::kBool:
      return (v.boolean ? 1 : 0) <= k;
    case JsonType::kInt:
      return v.integer <= k;
    default:
      return v.number <= static_cast<double>(k);
  }
}

// The int64 F with `n > v` <=> `n > F` for every int n the manager compares
// against v (`len(...) > max_sessions`, `bytes > budget`): floor(v), clamped;
// NaN compares false like +inf.
int64_t FloorClamp(const JsonValue& v) {
  switch (v.type) {
    case JsonType::kBool:
      return v.boolean ? 1 : 0;
    case JsonType::kInt:
      return v.integer;
    default: {
      const double f = v.number;
      if (std::isnan(f) || f >= kTwo63) return kInt64Max;
      if (f < -kTwo63) return kInt64Min;
      return static_cast<int64_t>(std::floor(f));
    }
  }
}

double ToDouble(const JsonValue& v) {
  switch (v.type) {
    case JsonType::kBool:
      return v.boolean ? 1.0 : 0.0;
    case JsonType::kInt:
      return v.big ? std::strtod(std::string(v.text).c_str(), nullptr)
                   : static_cast<double>(v.integer);
    default:
      return v.number;
  }
}

// Python comparison of two ints (big ones by their decimal text).
int CompareInt(const JsonValue& a, const JsonValue& b) {
  if (!a.big && !b.big) return a.integer < b.integer ? -1 : (a.integer > b.integer ? 1 : 0);
  const int sa = a.integer < 0 ? -1 : 1;
  const int sb = b.integer < 0 ? -1 : 1;
  if (a.big && !b.big) return sa;
  if (!a.big && b.big) return -sb;
  if (sa != sb) return sa < sb ? -1 : 1;
  int c = a.text.size() < b.text.size() ? -1 : (a.text.size() > b.text.size() ? 1 : 0);
  if (c == 0) c = a.text.compare(b.text) < 0 ? -1 : (a.text.compare(b.text) > 0 ? 1 : 0);
  return sa < 0 ? -c : c;
}

// numpy dtype spellings whose dtype().name is float32 / float16 (numpy 1.24).
struct DtypeAlias {
  const char* name;
  KvDtype dtype;
};
constexpr DtypeAlias kDtypeAliases[] = {
    {"float32", KvDtype::kF32},   {"single", KvDtype::kF32}, {"f", KvDtype::kF32},
    {"f4", KvDtype::kF32},        {"<f", KvDtype::kF32},     {"<f4", KvDtype::kF32},
    {">f", KvDtype::kF32},        {">f4", KvDtype::kF32},    {"=f", KvDtype::kF32},
    {"=f4", KvDtype::kF32},       {"|f", KvDtype::kF32},     {"|f4", KvDtype::kF32},
    {"float16", KvDtype::kF16},   {"half", KvDtype::kF16},   {"e", KvDtype::kF16},
    {"f2", KvDtype::kF16},        {"<e", KvDtype::kF16},     {"<f2", KvDtype::kF16},
    {">e", KvDtype::kF16},        {">f2", KvDtype::kF16},    {"=e", KvDtype::kF16},
    {"=f2", KvDtype::kF16},       {"|e", KvDtype::kF16},     {"|f2", KvDtype::kF16},
    {"bfloat16", KvDtype::kBF16},  // our extensions; numpy has no bfloat16,
    {"q8_0", KvDtype::kQ8_0},      // q8_0 or q4_0
    {"q4_0", KvDtype::kQ4_0},
};

// n_kv_heads / head_dim: __post_init__ only checks `v <= 0`, so any number
// passes; the value stored per layer is int(v).
struct Geometry {
  bool storable = false;
  int value = 0;
  bool is_float = false;
  double as_double = 0;
};
bool ReadGeometry(const JsonValue& v, Geometry* g, std::string* repr) {
  if (!v.is_number() || PyLessEq(v, 0)) return false;
  g->as_double = ToDouble(v);
  switch (v.type) {
    case JsonType::kBool:  // only true gets here
      repr->append("true");
      g->storable = true;
      g->value = 1;
      break;
    case JsonType::kInt:
      repr->append(v.text);
      g->storable = !v.big && v.integer <= std::numeric_limits<int>::max();
      g->value = g->storable ? static_cast<int>(v.integer) : 0;
      break;
    default:
      AppendPyFloatRepr(v.number, repr);
      g->is_float = true;
      g->storable = std::isfinite(v.number) && v.number == std::floor(v.number) &&
                    v.number <= std::numeric_limits<int>::max();
      g->value = g->storable ? static_cast<int>(v.number) : 0;
  }
  return true;
}

// The reference's canonical recipe JSON (json.dumps(sort_keys=True,
// separators=(",", ":"))), from the values' Python reprs.
std::string CanonicalRecipe(std::string_view start, std::string_view end, std::string_view total,
                            const std::string& heads, const std::string& dim, KvDtype dtype) {
  std::string canonical = "{\"architecture_adapter\":\"llama\",\"boundary_schema_version\":1,";
  canonical += "\"end_layer\":";
  canonical += end;
  canonical += ",\"head_dim\":" + dim;
  canonical += ",\"kind\":\"hot-kv-recipe\",\"kv_dtype\":\"";
  canonical += KvDtypeName(dtype);
  canonical += "\",\"n_kv_heads\":" + heads;
  canonical += ",\"start_layer\":";
  canonical += start;
  canonical += ",\"total_layers\":";
  canonical += total;
  canonical += "}";
  return canonical;
}

}  // namespace

bool NonNegativeIntArg(const JsonValue& v, int64_t* out) {
  if (v.type != JsonType::kInt || v.big || v.integer < 0) return false;
  *out = v.integer;
  return true;
}

std::optional<int64_t> ExpectedSeqLenArg(const JsonValue* v) {
  if (v == nullptr || v->type == JsonType::kNull) return std::nullopt;
  switch (v->type) {
    case JsonType::kBool:
      return v->boolean ? 1 : 0;
    case JsonType::kInt:
      return (!v->big && v->integer >= 0) ? v->integer : kNeverSeqLen;
    case JsonType::kFloat: {
      const double f = v->number;
      if (std::isfinite(f) && f >= 0 && f == std::floor(f) && f < kTwo63) {
        return static_cast<int64_t>(f);
      }
      return kNeverSeqLen;
    }
    default:
      return kNeverSeqLen;  // a str, list or dict is never == an int
  }
}

int64_t TruncateLengthArg(const JsonValue& v) {
  switch (v.type) {
    case JsonType::kBool:
      return v.boolean ? 1 : 0;
    case JsonType::kInt:
      return v.big ? (v.integer < 0 ? -1 : kInt64Max) : v.integer;
    case JsonType::kFloat: {
      const double f = v.number;
      // `f < 0` raises ValueError; int(nan) raises ValueError; int(inf) raises
      // OverflowError (a crash in the reference, invalid-argument here).
      if (!std::isfinite(f) || f < 0) return -1;
      return f >= kTwo63 ? kInt64Max : static_cast<int64_t>(f);  // int() truncates
    }
    default:
      return -1;  // `"3" < 0` / `None < 0` raise TypeError
  }
}

bool ClockArg(const JsonValue& v, double* out) {
  switch (v.type) {
    case JsonType::kBool:
    case JsonType::kFloat:
      *out = ToDouble(v);
      return true;
    case JsonType::kInt:
      *out = ToDouble(v);
      return std::isfinite(*out);  // float(huge int) raises OverflowError
    case JsonType::kString:
      return ParsePyFloatString(v.text, out);
    default:
      return false;
  }
}

SessionKind SessionKeyArg(const JsonValue& v, std::string* key) {
  key->assign("\xff");
  switch (v.type) {
    case JsonType::kString:
      key->clear();
      return SessionKind::kStr;
    case JsonType::kArray:
    case JsonType::kObject:
      return SessionKind::kUnhashable;
    case JsonType::kNull:
      key->append("None");
      return SessionKind::kOther;
    case JsonType::kBool:
      key->append(v.boolean ? "#1" : "#0");
      return SessionKind::kOther;
    case JsonType::kInt:
      key->push_back('#');
      key->append(v.text);
      return SessionKind::kOther;
    default:
      break;
  }
  const double f = v.number;
  if (std::isnan(f)) {
    // NaN equals nothing, but json.loads returns one shared NaN object for every
    // NaN literal and dict lookups try identity first: all NaN ids are one key.
    key->append("NaN");
  } else if (std::isinf(f)) {
    key->append(f > 0 ? "#inf" : "#-inf");
  } else if (f == std::floor(f)) {  // equal to the int of the same value
    char buf[400];
    std::snprintf(buf, sizeof(buf), "%.0f", f);  // exact in glibc
    key->push_back('#');
    key->append(std::string_view(buf) == "-0" ? "0" : buf);
  } else {
    key->push_back('~');
    AppendPyFloatRepr(f, key);
  }
  return SessionKind::kOther;
}

bool ConfigArgs(const JsonDocument& doc, const JsonValue& op, HotKvStateConfig* out) {
  const JsonValue* budget = doc.Find(op, "budget_bytes");
  const JsonValue* max_sessions = doc.Find(op, "max_sessions");
  const JsonValue* ttl = doc.Find(op, "ttl_seconds");
  const JsonValue* miss_history = doc.Find(op, "miss_history");
  if (!budget || !max_sessions || !ttl || !miss_history) return false;  // KeyError
  // Comparisons with anything but a number raise TypeError.
  if (!budget->is_number() || !max_sessions->is_number() || !ttl->is_number() ||
      !miss_history->is_number()) {
    return false;
  }
  if (PyLessEq(*budget, 0) || PyLess(*max_sessions, 1) || PyLess(*ttl, 0) ||
      PyLess(*miss_history, 0)) {
    return false;
  }
  HotKvStateConfig c;
  // Byte totals are multiples of bytes_per_token (>= 4), so a budget in (0, 1)
  // (floor 0) behaves exactly like a budget of 1.
  c.budget_bytes = std::max<int64_t>(FloorClamp(*budget), 1);
  c.max_sessions = FloorClamp(*max_sessions);
  const double t = ToDouble(*ttl);
  c.ttl_seconds = std::isnan(t) ? std::numeric_limits<double>::infinity() : (t == 0 ? 0.0 : t);
  c.miss_history = FloorClamp(*miss_history);
  c.block_tokens = 1;
  if (const JsonValue* bt = doc.Find(op, "block_tokens")) {
    const bool equals_one = (bt->type == JsonType::kBool && bt->boolean) ||
                            (bt->type == JsonType::kInt && !bt->big && bt->integer == 1) ||
                            (bt->type == JsonType::kFloat && bt->number == 1.0);
    if (equals_one) {
      c.block_tokens = 1;  // `!= 1` is false for 1, 1.0 and true
    } else if (bt->type == JsonType::kInt && !bt->big && bt->integer >= 1 &&
               bt->integer <= std::numeric_limits<int>::max()) {
      c.block_tokens = static_cast<int>(bt->integer);  // our extension: paged blocks
    } else {
      return false;
    }
  }
  *out = c;
  return true;
}

namespace {

// The kv_dtype alias a recipe names, or nullptr for anything else.
const DtypeAlias* FindDtypeAlias(const JsonValue& dtype) {
  if (dtype.type != JsonType::kString) return nullptr;
  const DtypeAlias* alias = nullptr;
  for (const DtypeAlias& a : kDtypeAliases) {
    if (dtype.text == a.name) alias = &a;
  }
  return alias;
}

// role_for_range: ints (not bools), 0 <= start <= end <= total - 1.
bool IsLayerRange(const JsonValue& start, const JsonValue& end, const JsonValue& total) {
  for (const JsonValue* v : {&start, &end, &total}) {
    if (v->type != JsonType::kInt) return false;
  }
  JsonValue zero;
  zero.type = JsonType::kInt;
  return CompareInt(start, zero) >= 0 && CompareInt(start, end) <= 0 && CompareInt(end, total) < 0;
}

}  // namespace

bool ParseTraceRecipe(const JsonDocument& doc, const JsonValue& obj, TraceRecipe* out) {
  // make_recipe: a non-dict raises KeyError or TypeError; a missing field KeyError.
  if (obj.type != JsonType::kObject) return false;
  const JsonValue* arch = doc.Find(obj, "architecture_adapter");
  const JsonValue* dtype = doc.Find(obj, "kv_dtype");
  const JsonValue* heads = doc.Find(obj, "n_kv_heads");
  const JsonValue* dim = doc.Find(obj, "head_dim");
  const JsonValue* total = doc.Find(obj, "total_layers");
  const JsonValue* start = doc.Find(obj, "start_layer");
  const JsonValue* end = doc.Find(obj, "end_layer");
  if (!arch || !dtype || !heads || !dim || !total || !start || !end) return false;
  // certified_architecture: exactly these two names (the C++ registry knows
  // more, but the trace contract is the reference's).
  if (arch->type != JsonType::kString ||
      (arch->text != "llama" && arch->text != "LlamaForCausalLM")) {
    return false;
  }
  std::string heads_repr, dim_repr;
  Geometry gh, gd;
  if (!ReadGeometry(*heads, &gh, &heads_repr) || !ReadGeometry(*dim, &gd, &dim_repr)) return false;
  const DtypeAlias* alias = FindDtypeAlias(*dtype);
  if (alias == nullptr || !IsLayerRange(*start, *end, *total)) return false;
  // Ours, so no Python typing to mirror: q8_0 / q4_0 take int geometry only.
  if (IsQuantizedKv(alias->dtype) &&
      (heads->type != JsonType::kInt || dim->type != JsonType::kInt)) {
    return false;
  }
  out->fingerprint = Sha256Hex(
      CanonicalRecipe(start->text, end->text, total->text, heads_repr, dim_repr, alias->dtype));

  const int64_t int_max = std::numeric_limits<int>::max();
  const bool layers_fit = !total->big && total->integer <= int_max;  // start <= end < total
  const int64_t n_layers = layers_fit ? end->integer - start->integer + 1 : 0;
  const int item = KvDtypeSize(alias->dtype);
  // q8_0 / q4_0: bytes per head instead of head_dim * itemsize.
  const __int128 head_bytes = IsQuantizedKv(alias->dtype) ? KvHeadBytes(alias->dtype, gd.value)
                                                          : static_cast<__int128>(gd.value) * item;
  out->storable = gh.storable && gd.storable && layers_fit &&
                  static_cast<__int128>(2) * gh.value * head_bytes * n_layers <=
                      (static_cast<__int128>(1) << 53);
  out->float_bytes_per_token = gh.is_float || gd.is_float;
  // Python: 2 * n_kv_heads * head_dim * itemsize * len(owned_layers), left to right.
  out->bytes_per_token = 2.0 * gh.as_double * gd.as_double * item * static_cast<double>(n_layers);
  if (out->storable) {
    KvCacheRecipe& r = out->recipe;
    r.architecture_adapter = "llama";
    r.kv_dtype = alias->dtype;
    r.n_kv_heads = gh.value;
    r.head_dim = gd.value;
    r.total_layers = static_cast<int>(total->integer);
    r.start_layer = static_cast<int>(start->integer);
    r.end_layer = static_cast<int>(end->integer);
    r.boundary_schema_version = 1;
  }
  return true;
}

}  // namespace meshnet::kv::trace
