// Tests of the trace replayer: the Python-compatible JSON layer, the argument
// semantics, and whole replays (checked against values derived from the spec
// independently of the replayer, and the two append paths against each other).
#include "kvtrace/trace_replay.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kvtrace/trace_args.h"
#include "kvtrace/trace_json.h"
#include "util/dtype.h"
#include "util/hash.h"

// The largest single allocation while g_track_allocations is set (for the
// bounded-memory test below).
namespace {
std::atomic<bool> g_track_allocations{false};
std::atomic<size_t> g_largest_allocation{0};
}  // namespace

void* operator new(std::size_t size) {
  if (g_track_allocations.load(std::memory_order_relaxed) &&
      size > g_largest_allocation.load(std::memory_order_relaxed)) {
    g_largest_allocation.store(size, std::memory_order_relaxed);
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace meshnet::kv {
namespace {

using trace::JsonDocument;
using trace::JsonType;

std::string Repr(double x) {
  std::string s;
  trace::AppendPyFloatRepr(x, &s);
  return s;
}
std::string Dumps(std::string_view s) {
  std::string out;
  trace::AppendPyJsonString(s, &out);
  return out;
}

TEST(TraceJson, AcceptsWhatJsonLoadsAccepts) {
  JsonDocument d;
  ASSERT_TRUE(d.Parse(R"( {"a":1,"a":2.5,"n":NaN,"i":-Infinity,"b":true,"z":null} )"));
  const auto& root = d.root();
  EXPECT_EQ(d.Find(root, "a")->type, JsonType::kFloat);  // the last duplicate wins
  EXPECT_EQ(d.Find(root, "a")->number, 2.5);
  EXPECT_TRUE(std::isnan(d.Find(root, "n")->number));
  EXPECT_EQ(d.Find(root, "i")->number, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(d.Find(root, "b")->type, JsonType::kBool);
  EXPECT_EQ(d.Find(root, "z")->type, JsonType::kNull);
  EXPECT_EQ(d.Find(root, "missing"), nullptr);

  ASSERT_TRUE(d.Parse(R"({"big":123456789012345678901234567890,"neg0":-0,"e":1E2,"f":1e400})"));
  const auto* big = d.Find(d.root(), "big");
  EXPECT_EQ(big->type, JsonType::kInt);
  EXPECT_TRUE(big->big);
  EXPECT_EQ(big->text, "123456789012345678901234567890");
  EXPECT_EQ(d.Find(d.root(), "neg0")->text, "0");
  EXPECT_EQ(d.Find(d.root(), "e")->type, JsonType::kFloat);
  EXPECT_EQ(d.Find(d.root(), "f")->number, std::numeric_limits<double>::infinity());

  // Escapes: a surrogate pair joins, a lone surrogate stays (WTF-8).
  ASSERT_TRUE(d.Parse(R"(["\u00e9\ud83d\ude00\ud800x\/\n"])"));
  ASSERT_TRUE(d.Parse(R"({"s":"\u00e9\ud83d\ude00\ud800x\/"})"));
  EXPECT_EQ(d.Find(d.root(), "s")->text, "\xc3\xa9\xf0\x9f\x98\x80\xed\xa0\x80x/");
  EXPECT_TRUE(trace::HasLoneSurrogate(d.Find(d.root(), "s")->text));
}

TEST(TraceJson, RefusesWhatJsonLoadsRefuses) {
  JsonDocument d;
  for (const char* bad :
       {"",          "   ",  "{",      "{\"a\":1,}", "[1,]",        "{'a':1}",     "01",
        "1.",        ".5",   "+1",     "-",          "1e",          "{\"a\":1} x", "nan",
        "infinity",  "-NaN", "\"\t\"", "\"\\x\"",    "\"\\u12g4\"", "{1:2}",       "\xef\xbb\xbf{}",
        "{\"a\" 1}", "tru",  "[1 2]"}) {
    EXPECT_FALSE(d.Parse(bad)) << bad;
  }
  EXPECT_FALSE(d.Parse(std::string(4301, '7')));  // Python's int digit limit
  EXPECT_TRUE(d.Parse(std::string(4300, '7')));
  std::string deep(JsonDocument::kMaxDepth + 1, '[');
  deep += std::string(JsonDocument::kMaxDepth + 1, ']');
  EXPECT_FALSE(d.Parse(deep));
}

TEST(TraceJson, FloatReprMatchesPython) {
  // Values of repr() in CPython.
  EXPECT_EQ(Repr(1.0), "1.0");
  EXPECT_EQ(Repr(-0.0), "-0.0");
  EXPECT_EQ(Repr(0.1), "0.1");
  EXPECT_EQ(Repr(123.5), "123.5");
  EXPECT_EQ(Repr(1e16), "1e+16");
  EXPECT_EQ(Repr(1e15), "1000000000000000.0");
  EXPECT_EQ(Repr(1.5e16), "1.5e+16");
  EXPECT_EQ(Repr(0.0001), "0.0001");
  EXPECT_EQ(Repr(0.00001), "1e-05");
  EXPECT_EQ(Repr(1.25e-7), "1.25e-07");
  EXPECT_EQ(Repr(5e-324), "5e-324");
  EXPECT_EQ(Repr(1.7976931348623157e308), "1.7976931348623157e+308");
  EXPECT_EQ(Repr(std::nan("")), "NaN");
  EXPECT_EQ(Repr(-INFINITY), "-Infinity");
}

TEST(TraceJson, StringEscapesMatchJsonDumps) {
  EXPECT_EQ(Dumps("s\xc3\xa9"
                  "ance-\xc3\xbc"),
            "\"s\xc3\xa9"
            "ance-\xc3\xbc\"");  // raw UTF-8
  EXPECT_EQ(Dumps(std::string("a\"b\\c\n\r\t\b\f\x01\x1f\x7f", 13)),
            "\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f\x7f\"");
  EXPECT_EQ(Dumps(std::string("\0", 1)), "\"\\u0000\"");
  EXPECT_EQ(Dumps("\xed\xa0\x80"), "\"\\ud800\"");  // a lone surrogate
}

TEST(TraceJson, PythonStrHelpers) {
  EXPECT_TRUE(trace::IsPyBlank(""));
  EXPECT_TRUE(trace::IsPyBlank(" \t\x0b\x0c\x1c\x1f"));
  EXPECT_TRUE(trace::IsPyBlank("\xe3\x80\x80\xc2\xa0"));  // U+3000, U+00A0
  EXPECT_FALSE(trace::IsPyBlank("\xe2\x80\x8b"));         // U+200B is not a space
  EXPECT_FALSE(trace::IsValidUtf8("\xed\xa0\x80"));       // an encoded surrogate
  EXPECT_FALSE(trace::IsValidUtf8("\xc0\xaf"));           // overlong
  EXPECT_FALSE(trace::IsValidUtf8("\xf4\x90\x80\x80"));   // above U+10FFFF
  EXPECT_TRUE(trace::IsValidUtf8("\xf0\x9f\x98\x80"));
  double v = 0;
  EXPECT_TRUE(trace::ParsePyFloatString(" 1_000.5\xe3\x80\x80", &v));
  EXPECT_EQ(v, 1000.5);
  EXPECT_TRUE(trace::ParsePyFloatString("-InFinity", &v));
  EXPECT_EQ(v, -INFINITY);
  EXPECT_TRUE(trace::ParsePyFloatString("5.", &v));
  EXPECT_TRUE(trace::ParsePyFloatString(".5e1", &v));
  EXPECT_EQ(v, 5.0);
  for (const char* bad : {"", ".", "1__0", "_1", "1_", "1e", "0x10", "1.5f", "in f", "nan()"}) {
    EXPECT_FALSE(trace::ParsePyFloatString(bad, &v)) << bad;
  }
}

TEST(TraceArgs, ExpectedSeqLenComparesLikePythonNotEqual) {
  JsonDocument d;
  std::string line;  // the document views into it
  auto expected = [&](const char* json) {
    line = std::string("{\"x\":") + json + "}";
    EXPECT_TRUE(d.Parse(line));
    return trace::ExpectedSeqLenArg(d.Find(d.root(), "x"));
  };
  EXPECT_EQ(expected("null"), std::nullopt);
  EXPECT_EQ(expected("3"), 3);
  EXPECT_EQ(expected("3.0"), 3);
  EXPECT_EQ(expected("true"), 1);
  EXPECT_EQ(expected("false"), 0);
  for (const char* never :
       {"\"3\"", "3.5", "-1", "NaN", "[3]", "{}", "1e300", "99999999999999999999999"}) {
    EXPECT_EQ(expected(never), trace::kNeverSeqLen) << never;
  }
}

TEST(TraceArgs, TruncateLengthFollowsIntAfterLookup) {
  JsonDocument d;
  std::string line;
  auto length = [&](const char* json) {
    line = std::string("{\"x\":") + json + "}";
    EXPECT_TRUE(d.Parse(line));
    return trace::TruncateLengthArg(*d.Find(d.root(), "x"));
  };
  EXPECT_EQ(length("5"), 5);
  EXPECT_EQ(length("2.7"), 2);
  EXPECT_EQ(length("-0.0"), 0);
  EXPECT_EQ(length("true"), 1);
  EXPECT_EQ(length("1e300"), std::numeric_limits<int64_t>::max());
  EXPECT_LT(length("-3"), 0);
  for (const char* raises : {"-0.5", "NaN", "Infinity", "\"3\"", "null", "[]"}) {
    EXPECT_LT(length(raises), 0) << raises;
  }
}

TEST(TraceArgs, NonStrSessionKeysUsePythonEquality) {
  JsonDocument d;
  std::string line;
  auto key = [&](const char* json) {
    line = std::string("{\"x\":") + json + "}";
    EXPECT_TRUE(d.Parse(line));
    std::string k;
    const auto kind = trace::SessionKeyArg(*d.Find(d.root(), "x"), &k);
    return kind == trace::SessionKind::kOther ? k : std::string("<") + char('0' + int(kind));
  };
  EXPECT_EQ(key("1"), key("1.0"));
  EXPECT_EQ(key("1"), key("true"));
  EXPECT_EQ(key("0"), key("-0.0"));
  EXPECT_EQ(key("100000000000000000000"), key("1e20"));
  EXPECT_NE(key("1"), key("1.5"));
  EXPECT_NE(key("null"), key("0"));
  EXPECT_EQ(key("NaN"), key("NaN"));  // json.loads' one shared NaN object
  EXPECT_NE(key("NaN"), key("Infinity"));
  EXPECT_EQ(key("\"s\""), "<0");
  EXPECT_EQ(key("[1]"), "<2");
}

// The canonical recipe JSON of the spec, hashed here without the replayer.
std::string SpecFingerprint(const std::string& heads, const std::string& dtype) {
  return Sha256Hex(
      "{\"architecture_adapter\":\"llama\",\"boundary_schema_version\":1,\"end_layer\":3,"
      "\"head_dim\":2,\"kind\":\"hot-kv-recipe\",\"kv_dtype\":\"" +
      dtype + "\",\"n_kv_heads\":" + heads + ",\"start_layer\":2,\"total_layers\":4}");
}

TEST(TraceArgs, RecipeFingerprintHashesThePythonValues) {
  JsonDocument d;
  std::string line;
  auto parse = [&](const std::string& arch, const std::string& dtype, const std::string& heads,
                   trace::TraceRecipe* r) {
    line = "{\"architecture_adapter\":\"" + arch + "\",\"kv_dtype\":\"" + dtype +
           "\",\"n_kv_heads\":" + heads +
           ",\"head_dim\":2,\"total_layers\":4,\"start_layer\":2,\"end_layer\":3}";
    EXPECT_TRUE(d.Parse(line));
    return trace::ParseTraceRecipe(d, d.root(), r);
  };
  trace::TraceRecipe r;
  ASSERT_TRUE(parse("llama", "float32", "1", &r));
  EXPECT_EQ(r.fingerprint, SpecFingerprint("1", "float32"));
  EXPECT_EQ(r.fingerprint, r.recipe.Fingerprint());  // kv's canonical JSON agrees
  EXPECT_EQ(r.fingerprint, "bdc1fda85dfd29db05f5c0288a8dab7ed8bb2b9ead8216dea70e131e652443a3");
  ASSERT_TRUE(parse("LlamaForCausalLM", "<f4", "1", &r));
  EXPECT_EQ(r.fingerprint, SpecFingerprint("1", "float32"));
  ASSERT_TRUE(parse("llama", "half", "true", &r));
  EXPECT_EQ(r.fingerprint, SpecFingerprint("true", "float16"));
  EXPECT_TRUE(r.storable);
  ASSERT_TRUE(parse("llama", "float32", "2.0", &r));
  EXPECT_EQ(r.fingerprint, SpecFingerprint("2.0", "float32"));
  EXPECT_TRUE(r.float_bytes_per_token);
  EXPECT_EQ(r.bytes_per_token, 64.0);                 // 2 * 2.0 * 2 * 4 * 2 layers
  ASSERT_TRUE(parse("llama", "float32", "2.5", &r));  // valid in Python, not storable
  EXPECT_FALSE(r.storable);
  EXPECT_FALSE(parse("mistral", "float32", "1", &r));
  EXPECT_FALSE(parse("llama", "float64", "1", &r));
  EXPECT_FALSE(parse("llama", "float32", "0", &r));
  EXPECT_FALSE(parse("llama", "float32", "\"1\"", &r));
}

// --- whole replays ------------------------------------------------------------------

const char* kConfig =
    R"({"op":"config","budget_bytes":256,"max_sessions":2,"ttl_seconds":10.0,"miss_history":4,)"
    R"("block_tokens":1,"recipe":{"architecture_adapter":"llama","kv_dtype":"float32",)"
    R"("n_kv_heads":1,"head_dim":2,"total_layers":4,"start_layer":2,"end_layer":3}})";

// The checksum of session "a" epoch 0 after 2 tokens, from the spec's formula
// evaluated here (layer 2 gives K rows [[0.482,0.483],[0.499,0.5]]).
std::string ChecksumOfA() {
  const uint64_t fnv = Fnv1a32("a");
  EXPECT_EQ(fnv, 3826002220u);
  Sha256 sha;
  for (int layer = 2; layer <= 3; ++layer) {
    std::vector<float> k, v;
    for (int p = 0; p < 2; ++p) {
      for (int dim = 0; dim < 2; ++dim) {
        const double x = static_cast<double>((fnv + 131 * layer + 17 * p + dim) % 1000) / 1000.0;
        k.push_back(static_cast<float>(x));
        v.push_back(static_cast<float>(-x));
      }
    }
    if (layer == 2) {
      EXPECT_EQ(k, (std::vector<float>{0.482f, 0.483f, 0.499f, 0.5f}));
    }
    sha.Update(k.data(), k.size() * 4);
    sha.Update(v.data(), v.size() * 4);
  }
  return sha.HexDigest().substr(0, 16);
}

TEST(TraceReplayer, AppendedRowsFollowTheSpecFormula) {
  for (auto path : {ReplayAppendPath::kAppend, ReplayAppendPath::kStep}) {
    TraceReplayer r(path);
    EXPECT_EQ(
        r.Step(kConfig),
        R"({"ok":true,"fingerprint":"bdc1fda85dfd29db05f5c0288a8dab7ed8bb2b9ead8216dea70e131e652443a3","bytes_per_token":32})");
    EXPECT_EQ(r.Step(R"({"op":"open","session":"a","epoch":0})"), R"({"ok":true,"seq_len":0})");
    EXPECT_EQ(r.Step(R"({"op":"resolve","session":"a","epoch":0})"),
              R"({"ok":true,"seq_len":0,"checksum":"e3b0c44298fc1c14"})");
    EXPECT_EQ(r.Step(R"({"op":"append","session":"a","epoch":0,"tokens":1})"),
              R"({"ok":true,"seq_len":1})");
    EXPECT_EQ(
        r.Step(R"({"op":"append","session":"a","epoch":0,"tokens":1,"expected_seq_len":1.0})"),
        R"({"ok":true,"seq_len":2})");
    EXPECT_EQ(r.Step(R"({"op":"get","session":"a","epoch":0})"),
              R"({"ok":true,"seq_len":2,"checksum":")" + ChecksumOfA() + "\"}");
  }
}

// bfloat16 is our extension (numpy has none): rows are rounded from float32,
// and the checksum widens them back, both computed here independently.
TEST(TraceReplayer, Bfloat16RowsAreRoundedFromFloat32) {
  std::string config = kConfig;
  config.replace(config.find("float32"), 7, "bfloat16");
  Sha256 sha;
  const uint64_t fnv = Fnv1a32("b");
  for (int layer = 2; layer <= 3; ++layer) {
    std::vector<float> k, v;
    for (int dim = 0; dim < 2; ++dim) {
      const double x = static_cast<double>((fnv + 31 * 4 + 131 * layer + dim) % 1000) / 1000.0;
      k.push_back(Bf16ToFloat(FloatToBf16(static_cast<float>(x))));
      v.push_back(Bf16ToFloat(FloatToBf16(static_cast<float>(-x))));
    }
    sha.Update(k.data(), k.size() * 4);
    sha.Update(v.data(), v.size() * 4);
  }
  const std::string expected = sha.HexDigest().substr(0, 16);
  for (auto path : {ReplayAppendPath::kAppend, ReplayAppendPath::kStep}) {
    TraceReplayer r(path);
    EXPECT_NE(r.Step(config).find("\"bytes_per_token\":16}"), std::string::npos);
    EXPECT_EQ(r.Step(R"({"op":"open","session":"b","epoch":4})"), R"({"ok":true,"seq_len":0})");
    EXPECT_EQ(r.Step(R"({"op":"append","session":"b","epoch":4,"tokens":1})"),
              R"({"ok":true,"seq_len":1})");
    EXPECT_EQ(r.Step(R"({"op":"get","session":"b","epoch":4})"),
              R"({"ok":true,"seq_len":1,"checksum":")" + expected + "\"}");
  }
}

TEST(TraceReplayer, BadLinesAnswerInvalidArgumentAndChangeNothing) {
  TraceReplayer r;
  EXPECT_EQ(r.Step(R"({"op":"open","session":"a","epoch":0})"), R"({"error":"invalid-argument"})");
  ASSERT_NE(r.Step(kConfig).find("\"ok\":true"), std::string::npos);
  EXPECT_EQ(r.Step(R"({"op":"open","t":0.0,"session":"a","epoch":0})"),
            R"({"ok":true,"seq_len":0})");
  EXPECT_EQ(r.Step(""), "");
  EXPECT_EQ(r.Step(" \t\xe3\x80\x80"), "");
  for (const char* bad :
       {"{not json", "[1,2]", "7", "\"stats\"", "\xff\xfe", R"({"op":"stats","t":null})",
        R"({"op":"stats","t":"soon"})", R"({"op":"stats","t":99.0} trailing)"}) {
    EXPECT_EQ(r.Step(bad), R"({"error":"invalid-argument"})") << bad;
  }
  // None of those moved the clock past the TTL (10 s).
  EXPECT_EQ(r.Step(R"({"op":"stats"})"),
            R"({"ok":true,"sessions":1,"total_bytes":0,"keys":[["a",0]]})");
  // A "t" float() accepts as a string moves it.
  EXPECT_EQ(r.Step(R"({"op":"stats","t":" 10.5 "})"),
            R"({"ok":true,"sessions":0,"total_bytes":0,"keys":[]})");
  EXPECT_EQ(r.Step(R"({"op":"resolve","session":"a","epoch":0})"), R"({"miss":"evicted-ttl"})");
}

TEST(TraceReplayer, PythonTypingOfArguments) {
  TraceReplayer r;
  ASSERT_NE(r.Step(kConfig).find("\"ok\":true"), std::string::npos);
  const std::string invalid = R"({"error":"invalid-argument"})";
  EXPECT_EQ(r.Step(R"({"op":"open","session":"a","epoch":true})"), invalid);
  EXPECT_EQ(r.Step(R"({"op":"open","session":"a","epoch":1.0})"), invalid);
  EXPECT_EQ(r.Step(R"({"op":"open","session":"   ","epoch":0})"), invalid);
  EXPECT_EQ(r.Step(R"({"op":"open","session":"a","epoch":1})"), R"({"ok":true,"seq_len":0})");
  EXPECT_EQ(r.Step(R"({"op":"append","session":"a","epoch":1,"tokens":true})"), invalid);
  EXPECT_EQ(r.Step(R"({"op":"append","session":"a","epoch":1,"tokens":2})"),
            R"({"ok":true,"seq_len":2})");
  // Truncate: a string length is refused only after the live lookup.
  EXPECT_EQ(r.Step(R"({"op":"truncate","session":"zz","epoch":0,"length":"1"})"),
            R"({"error":"cache-miss","reason":"unknown-session"})");
  EXPECT_EQ(r.Step(R"({"op":"truncate","session":"a","epoch":1,"length":"1"})"), invalid);
  EXPECT_EQ(r.Step(R"({"op":"truncate","session":"a","epoch":1,"length":1.9})"),
            R"({"ok":true,"seq_len":1})");
  // Stale epoch wins over the missing-context answer.
  EXPECT_EQ(r.Step(R"({"op":"resolve","session":"a","epoch":0})"), R"({"error":"stale-epoch"})");
  // Release of a non-str key, found again by an equal key.
  EXPECT_EQ(r.Step(R"({"op":"release","session":1,"epoch":0})"), R"({"ok":true,"released":false})");
  EXPECT_EQ(r.Step(R"({"op":"resolve","session":true,"epoch":0})"), R"({"miss":"released"})");
  // A raised miss formats session_id[:8]: TypeError for a non-str id.
  EXPECT_EQ(r.Step(R"({"op":"get","session":1.0,"epoch":0})"), invalid);
  EXPECT_EQ(r.Step(R"({"op":"truncate","session":null,"epoch":0,"length":1})"), invalid);
  EXPECT_EQ(r.Step(R"({"op":"resolve","session":[1],"epoch":0})"), invalid);
  // expected_seq_len "1" != 1 drops the session.
  EXPECT_EQ(r.Step(R"({"op":"resolve","session":"a","epoch":1,"expected_seq_len":"1"})"),
            R"({"miss":"seq-len-mismatch"})");
  EXPECT_EQ(r.Step(R"({"op":"resolve","session":"a","epoch":1})"),
            R"({"miss":"seq-len-mismatch"})");
}

// A pseudo-random trace over a few sessions, replayed through both append
// paths: the results must be identical (and they are checked against the
// reference by the golden and differential tests).
TEST(TraceReplayer, AppendAndStepPathsAgree) {
  for (const char* dtype : {"float32", "float16", "bfloat16"}) {
    std::mt19937 rng(7);
    std::ostringstream trace;
    trace << R"({"op":"config","budget_bytes":4096,"max_sessions":3,"ttl_seconds":2.0,)"
          << R"("miss_history":3,"block_tokens":1,"recipe":{"architecture_adapter":"llama",)"
          << R"("kv_dtype":")" << dtype
          << R"(","n_kv_heads":2,"head_dim":3,"total_layers":3,"start_layer":1,"end_layer":2}})"
          << "\n";
    const char* ops[] = {"open", "append", "append", "resolve", "truncate", "release", "stats"};
    double t = 0;
    for (int i = 0; i < 400; ++i) {
      t += 0.25 * (rng() % 3);
      trace << "{\"op\":\"" << ops[rng() % 7] << "\",\"t\":" << t << ",\"session\":\"s" << rng() % 4
            << "\",\"epoch\":" << rng() % 2 << ",\"tokens\":" << rng() % 5
            << ",\"length\":" << rng() % 6 << "}\n";
    }
    std::istringstream in1(trace.str()), in2(trace.str());
    std::ostringstream out1, out2;
    ASSERT_EQ(ReplayStream(in1, out1, ReplayAppendPath::kAppend), 0);
    ASSERT_EQ(ReplayStream(in2, out2, ReplayAppendPath::kStep), 0);
    EXPECT_EQ(out1.str(), out2.str()) << dtype;
    EXPECT_NE(out1.str().find("checksum"), std::string::npos);
  }
}

TEST(TraceReplayer, StreamSplitsLinesLikePythonTextMode) {
  std::istringstream in(std::string(kConfig) +
                        "\r{\"op\":\"stats\"}\r\n\r\n{\"op\":\"nope\"}\n\n{\"op\":\"stats\"}");
  std::ostringstream out;
  ASSERT_EQ(ReplayStream(in, out), 0);
  std::istringstream lines(out.str());
  std::vector<std::string> got;
  for (std::string l; std::getline(lines, l);) got.push_back(l);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[1], R"({"ok":true,"sessions":0,"total_bytes":0,"keys":[]})");
  EXPECT_EQ(got[2], R"({"error":"invalid-argument"})");
  EXPECT_EQ(got[3], got[1]);
}

// An endless line (`kv replay < /dev/zero`) must not grow without bound: a
// line beyond kMaxTraceLineBytes is one invalid-argument result, and the lines
// after it replay as usual.
TEST(TraceReplayer, OverlongLineIsOneErrorAndMemoryStaysBounded) {
  // A stream of zero bytes, `n` long, that counts what was read.
  class Zeros : public std::streambuf {
   public:
    explicit Zeros(size_t n) : left_(n) {}

   protected:
    int_type underflow() override {
      if (left_ == 0) return traits_type::eof();
      const size_t k = std::min(left_, buf_.size());
      left_ -= k;
      setg(buf_.data(), buf_.data(), buf_.data() + k);
      return traits_type::to_int_type(buf_[0]);
    }

   private:
    size_t left_;
    std::array<char, 1 << 16> buf_{};
  };
  Zeros zeros(16 * kMaxTraceLineBytes + 5);
  std::istream endless(&zeros);
  std::ostringstream out;
  g_largest_allocation = 0;
  g_track_allocations = true;
  const int rc = ReplayStream(endless, out);
  g_track_allocations = false;
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(out.str(), "{\"error\":\"invalid-argument\"}\n");
  // The read chunk and at most a capped line: nothing sized by the input.
  EXPECT_LE(g_largest_allocation, 4 * kMaxTraceLineBytes);

  const std::string big(kMaxTraceLineBytes + 1, ' ');
  std::istringstream in(std::string(kConfig) + "\n" + big + "\n{\"op\":\"stats\"}\n" + big +
                        "\r\n{\"op\":\"stats\"}");
  std::ostringstream out2;
  ASSERT_EQ(ReplayStream(in, out2), 0);
  std::istringstream lines(out2.str());
  std::vector<std::string> got;
  for (std::string l; std::getline(lines, l);) got.push_back(l);
  ASSERT_EQ(got.size(), 5u) << out2.str();
  EXPECT_EQ(got[1], R"({"error":"invalid-argument"})");
  EXPECT_EQ(got[2], R"({"ok":true,"sessions":0,"total_bytes":0,"keys":[]})");
  EXPECT_EQ(got[3], got[1]);
  EXPECT_EQ(got[4], got[2]);
}

}  // namespace
}  // namespace meshnet::kv
