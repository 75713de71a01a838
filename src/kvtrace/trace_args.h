// Trace op arguments read with the reference replayer's Python semantics
// (see trace_replay.h for the contract and the documented divergences).
//
// Each function answers what the reference's expression does with the JSON
// value: whether it raises (ValueError / TypeError / KeyError, all reported as
// invalid-argument) and, if not, the value the C++ manager must be given so
// that it behaves the same.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "kv/hot_kv_state.h"
#include "kv/recipe.h"
#include "kvtrace/trace_json.h"

namespace meshnet::kv::trace {

// A seq_len no context can have: what an expected_seq_len that can never
// compare equal is mapped to.
inline constexpr int64_t kNeverSeqLen = std::numeric_limits<int64_t>::max();

// route_epoch / tokens: an int (not a bool) >= 0. Ints beyond int64 (valid in
// Python) are refused: documented divergence.
bool NonNegativeIntArg(const JsonValue& v, int64_t* out);

// expected_seq_len, compared by the reference with `seq_len != value`:
// nullopt (no check) for absent or null; the int64 it equals numerically
// (true == 1, 2.0 == 2); kNeverSeqLen for anything no seq_len can equal
// (strings, lists, 2.5, NaN, negative numbers).
std::optional<int64_t> ExpectedSeqLenArg(const JsonValue* v);

// truncate length, which the reference checks (`length < 0`) and converts
// (`max(0, int(length))`) only after the live lookup: the length to give the
// manager, -1 standing for every value that raises there (negative, NaN, inf,
// non-numbers). Floats truncate toward zero; huge values clamp to int64 max.
int64_t TruncateLengthArg(const JsonValue& v);

// The clock value of "t", as float(op["t"]). False where float() raises.
bool ClockArg(const JsonValue& v, double* out);

// A session id used as a dict key. kStr: the id is the string itself.
// kOther: a hashable non-str value (null, bool, number), which no open can
// create, but which release records and lookups find with Python's equality
// (1 == 1.0 == true; every NaN literal is json's one shared NaN object, so
// NaN finds NaN by identity); *key gets a stand-in id starting with byte 0xFF,
// which no UTF-8 string holds. kUnhashable: a list or dict.
enum class SessionKind { kStr, kOther, kUnhashable };
SessionKind SessionKeyArg(const JsonValue& v, std::string* key);

// The manager config of a `config` op (budget_bytes, max_sessions,
// ttl_seconds, miss_history, block_tokens), validated as HotKvStateConfig's
// __post_init__ does, with numbers mapped to equivalent integer bounds. False
// for invalid-argument.
bool ConfigArgs(const JsonDocument& doc, const JsonValue& op, HotKvStateConfig* out);

// A recipe object as make_recipe + KvCacheRecipe.__post_init__ see it.
struct TraceRecipe {
  std::string fingerprint;             // the reference's fingerprint of the trace's values
  bool storable = false;               // representable by a KvCacheRecipe
  KvCacheRecipe recipe;                // valid when storable
  bool float_bytes_per_token = false;  // Python would compute a float (float geometry)
  double bytes_per_token = 0;          // that float
};
// False for invalid-argument.
bool ParseTraceRecipe(const JsonDocument& doc, const JsonValue& obj, TraceRecipe* out);

}  // namespace meshnet::kv::trace
