// The `meshnet` command under hostile or mistaken input (issue 8): every run
// is a child process with a time limit, so a hang fails the test. Nodes bind
// 127.0.0.1 port 0 only and are killed and reaped in teardown.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "arch/architecture.h"
#include "gguf/gguf_writer.h"
#include "model/synthetic_model.h"
#include "ops/simd_targets.h"
#include "rpc/test_util.h"
#include "tests/rpc/cli_run.h"
#include "tests/rpc/node_process.h"

namespace meshnet::rpc {
namespace {

using testing::CliResult;
using ::testing::HasSubstr;
using testing::NodeProcess;
using ::testing::Not;
using testing::RunCli;

const std::string kModel = MESHNET_SHIPPED_MODEL;
constexpr double kLimit = 60;  // seconds for any one run (sanitized builds are slow)

std::string Describe(const CliResult& r) {
  return "exit " + std::to_string(r.exit_code) + " signal " + std::to_string(r.signal) +
         (r.timed_out ? " TIMED OUT" : "") + "\n--- stdout ---\n" + r.out.substr(0, 2000) +
         "\n--- stderr ---\n" + r.err.substr(0, 2000);
}

class CliHardeningTest : public ::testing::Test {
 protected:
  CliResult Run(const std::vector<std::string>& args, double limit = kLimit) {
    return RunCli(MESHNET_BINARY, args, limit);
  }
  std::unique_ptr<NodeProcess> Serve(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--model", kModel, "--layers", "0-4", "--threads", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return std::make_unique<NodeProcess>(MESHNET_BINARY, args,
                                         dir_.file("node-" + std::to_string(++n_) + ".log"));
  }
  // A synthetic Llama GGUF (its own 300-token vocabulary) with `tweak` applied.
  std::string WriteModel(const std::string& name,
                         const std::function<void(gguf::GgufWriter&)>& tweak = {}) {
    gguf::GgufWriter w = model::SyntheticLlamaWriter(model::SyntheticLlamaSpec{});
    if (tweak) tweak(w);
    const std::string path = dir_.file(name);
    w.WriteFile(path);
    return path;
  }

  testing::ScratchDir dir_;
  int n_ = 0;
};

// Count flags are bounded when parsed: no pool of 100000 threads is ever
// attempted, no 2^31-token KV block accepted.
TEST_F(CliHardeningTest, CountFlagsAreBoundedAtParseTime) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"serve", "--layers", "0-4", "--threads", "100000"},
           {"serve", "--layers", "0-4", "--threads", "-1"},
           {"serve", "--layers", "0-4", "--rpc-threads", "1000000"},
           {"serve", "--layers", "0-4", "--block-tokens", "2147483647"},
           {"serve", "--layers", "0-4", "--max-sessions", "0"},
           {"generate", "--prompt", "x", "--threads", "100000"},
           {"generate", "--prompt", "x", "--max-tokens", "-1"},
           {"generate", "--prompt", "x", "--top-k", "-3"},
           {"inspect", kModel, "--max-array", "-1"},
       }) {
    const CliResult r = Run(args);
    EXPECT_FALSE(r.timed_out) << args[3];
    EXPECT_NE(r.exit_code, 0) << Describe(r);
    EXPECT_THAT(r.err, HasSubstr(args[args.size() - 2])) << Describe(r);
    EXPECT_THAT(r.err, HasSubstr("must be an integer in")) << Describe(r);
    EXPECT_THAT(r.out, Not(HasSubstr("listening on")));
  }
}

// `--shards 0` names the flag and the range (CLI11's default said "Value 0
// not a positive number" with no hint of the range).
TEST_F(CliHardeningTest, ShardsZeroSaysWhatIsAllowed) {
  const CliResult r = Run({"generate", "--prompt", "x", "--shards", "0"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--shards")) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("must be an integer in 1..1024, got '0'")) << Describe(r);
}

// A FIFO given as a model (or PEM file) is refused at once: the open must not
// wait for a writer while signals are blocked (it hung, ignoring SIGTERM).
TEST_F(CliHardeningTest, FifoInputsAreRefusedNotWaitedOn) {
  const std::string fifo = dir_.file("model.fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"serve", "--model", fifo, "--layers", "0-0"},
           {"generate", "--model", fifo, "--prompt", "x"},
           {"inspect", fifo},
           {"serve", "--model", kModel, "--layers", "0-4", "--tls-cert", fifo, "--tls-key", fifo},
       }) {
    const CliResult r = Run(args, 20);
    ASSERT_FALSE(r.timed_out) << args[0] << " blocked on a FIFO";
    EXPECT_EQ(r.exit_code, 2) << Describe(r);
    EXPECT_THAT(r.err, HasSubstr("not a regular file")) << Describe(r);
  }
}

// A GGUF whose block_count claims 2^31-1 layers: exit 2 with a clear message
// (was std::bad_alloc, exit 1).
TEST_F(CliHardeningTest, HugeDeclaredLayerCountExitsTwo) {
  const std::string path = WriteModel("huge.gguf", [](gguf::GgufWriter& w) {
    w.Set(CertifiedArchitectureFor("llama").Key(ArchKey::kBlockCount),
          gguf::WriterValue::U32(2147483647u));
  });
  const CliResult r = Run({"generate", "--model", path, "--prompt", "x", "--max-tokens", "1"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("2147483647 layers")) << Describe(r);
  EXPECT_THAT(r.err, Not(HasSubstr("bad_alloc")));
}

// inspect never writes raw control bytes from the file (terminal escapes).
TEST_F(CliHardeningTest, InspectEscapesFileContent) {
  const std::string path = WriteModel("evil.gguf", [](gguf::GgufWriter& w) {
    w.Set("x.\x1b]0;owned\x07\x1b[2J", gguf::WriterValue::String("\x1b[31mred\x9b"));
  });
  const CliResult r = Run({"inspect", path});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos);
  EXPECT_EQ(r.out.find('\x07'), std::string::npos);
  EXPECT_EQ(r.out.find('\x9b'), std::string::npos);
  EXPECT_THAT(r.out, HasSubstr("x.\\x1b]0;owned\\x07\\x1b[2J"));
}

// A block that cannot fit the budget is refused at start (it used to start
// and then refuse every step).
TEST_F(CliHardeningTest, ServeChecksBlockTokensAgainstTheBudgetAtStart) {
  const CliResult r = Run({"serve", "--model", kModel, "--layers", "0-4", "--threads", "1",
                           "--kv-budget", "64KiB", "--block-tokens", "65536"});
  ASSERT_FALSE(r.timed_out) << "serve started with a block larger than its budget";
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("--block-tokens 65536")) << Describe(r);
  EXPECT_THAT(r.out, Not(HasSubstr("listening on")));
}

// kv replay: a directory is an unreadable input, exit 2 as its help says.
TEST_F(CliHardeningTest, KvReplayDirectoryExitsTwo) {
  const CliResult r = Run({"kv", "replay", "-i", dir_.path().string()});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("a directory")) << Describe(r);
}

// generate --speculate K prints the text and ids of --speculate 0 (greedy
// and sampled), says how many drafts it kept, and refuses K outside 0..64
// at parse time.
TEST_F(CliHardeningTest, SpeculationKeepsTheOutput) {
  for (const char* temperature : {"0", "0.9"}) {
    std::vector<std::string> args = {
        "generate", "--prompt",      "Once upon a time", "-n",       "96",  "--seed",
        "3",        "--temperature", temperature,        "--output", "json"};
    const CliResult plain = Run(args);
    args.insert(args.end(), {"--speculate", "4"});
    const CliResult spec = Run(args);
    ASSERT_EQ(plain.exit_code, 0) << Describe(plain);
    ASSERT_EQ(spec.exit_code, 0) << Describe(spec);
    const auto a = nlohmann::json::parse(plain.out), b = nlohmann::json::parse(spec.out);
    EXPECT_EQ(b["generated_ids"], a["generated_ids"]) << temperature;
    EXPECT_EQ(b["text"], a["text"]) << temperature;
    EXPECT_GT(b["speculation"]["verify_steps"].get<int>(), 0);
  }
  for (const char* bad : {"-1", "65"}) {
    const CliResult r = Run({"generate", "--prompt", "x", "--speculate", bad});
    EXPECT_NE(r.exit_code, 0) << bad << "\n" << Describe(r);
    EXPECT_THAT(r.err, HasSubstr("--speculate: must be an integer in 0..64")) << Describe(r);
  }
}

// A draft model keeps the output; one of another vocabulary is refused.
TEST_F(CliHardeningTest, DraftModelKeepsTheOutputAndNeedsTheSameVocabulary) {
  const std::string dir = std::string(kModel).substr(0, std::string(kModel).rfind("/models/"));
  std::vector<std::string> args = {"generate", "--prompt", "Once upon a time", "-n",  "64",
                                   "--seed",   "3",        "--output",         "json"};
  const CliResult plain = Run(args);
  args.insert(args.end(), {"--draft-model", dir + "/tests/data/quant/stories260K-Q4_K_M.gguf"});
  const CliResult drafted = Run(args);
  ASSERT_EQ(plain.exit_code, 0) << Describe(plain);
  ASSERT_EQ(drafted.exit_code, 0) << Describe(drafted);
  const auto a = nlohmann::json::parse(plain.out), b = nlohmann::json::parse(drafted.out);
  EXPECT_EQ(b["generated_ids"], a["generated_ids"]);
  EXPECT_GT(b["speculation"]["accepted"].get<int>(), 0);
  const CliResult other = Run({"generate", "--prompt", "x", "--draft-model",
                               dir + "/tests/data/tokenizers/ggml-vocab-gpt-2.gguf"});
  EXPECT_EQ(other.exit_code, 2) << Describe(other);
  EXPECT_THAT(other.err, HasSubstr("--draft-model")) << Describe(other);
  EXPECT_THAT(other.err, HasSubstr("vocabulary")) << Describe(other);
}

// generate takes the dtype spellings serve takes.
TEST_F(CliHardeningTest, GenerateAcceptsHalfPrecisionAliases) {
  for (const char* dtype : {"f16", "bf16", "fp32"}) {
    const CliResult r = Run({"generate", "--prompt", "Once", "--max-tokens", "2", "--threads", "1",
                             "--kv-dtype", dtype});
    EXPECT_EQ(r.exit_code, 0) << dtype << "\n" << Describe(r);
  }
}

// The KV cache is float16 unless asked otherwise: a budget of one 16-position
// block of float32 rows on the head shard (2 layers x 4 KV heads x 8 dims x
// K and V x 4 bytes = 512 bytes per position) holds a generation past 16 positions
// in float16, and refuses it, naming the budget, with --kv-dtype float32.
TEST_F(CliHardeningTest, DefaultKvCacheIsFloat16) {
  const std::vector<std::string> args = {
      "generate",  "--prompt", "Once upon a time", "--max-tokens", "20",
      "--threads", "1",        "--kv-budget",      "8KiB"};
  const CliResult half = Run(args);
  EXPECT_EQ(half.exit_code, 0) << Describe(half);
  std::vector<std::string> f32 = args;
  f32.insert(f32.end(), {"--kv-dtype", "float32"});
  const CliResult full = Run(f32);
  EXPECT_EQ(full.exit_code, 2) << Describe(full);
  EXPECT_THAT(full.err, HasSubstr("exceeds the KV budget")) << Describe(full);
}

// --kv-dtype q8_0 stores 10 bytes a head of 8 where f16 stores 16: a budget
// of 6 KiB per shard (two q8_0 blocks of 16 positions, one f16 block) holds a
// 20-token generation in q8_0 and refuses it in f16, naming the budget.
TEST_F(CliHardeningTest, QuantizedKvCacheHoldsMoreTokensInTheSameBudget) {
  const std::vector<std::string> args = {
      "generate",  "--prompt", "Once upon a time", "--max-tokens", "20",
      "--threads", "1",        "--kv-budget",      "6KiB",         "--kv-dtype"};
  std::vector<std::string> q8 = args, f16 = args;
  q8.push_back("q8_0");
  f16.push_back("f16");
  const CliResult quant = Run(q8);
  EXPECT_EQ(quant.exit_code, 0) << Describe(quant);
  EXPECT_THAT(quant.out, HasSubstr("Once upon a time")) << Describe(quant);
  const CliResult half = Run(f16);
  EXPECT_EQ(half.exit_code, 2) << Describe(half);
  EXPECT_THAT(half.err, HasSubstr("exceeds the KV budget")) << Describe(half);
  std::vector<std::string> bad = args;
  bad.push_back("q5_0");
  const CliResult unknown = Run(bad);
  EXPECT_EQ(unknown.exit_code, 2) << Describe(unknown);
  EXPECT_THAT(unknown.err, HasSubstr("q8_0 or q4_0")) << Describe(unknown);
}

// The batching flags are range-checked before anything starts: exit 2 naming
// the flag, on serve, generate and api alike.
TEST_F(CliHardeningTest, BatchFlagsOutOfRangeExitTwo) {
  const std::vector<std::vector<std::string>> cases = {
      {"serve", "--model", kModel, "--layers", "0-4", "--max-batch-tokens", "0"},
      {"serve", "--model", kModel, "--layers", "0-4", "--max-batch-sessions", "4097"},
      {"generate", "--prompt", "x", "--prefill-chunk", "0"},
      {"generate", "--prompt", "x", "--max-batch-tokens", "65537"},
      {"api", "--listen", "127.0.0.1:0", "--max-batch-sessions", "0"},
  };
  for (const auto& args : cases) {
    const CliResult r = Run(args);
    ASSERT_FALSE(r.timed_out) << args[0] << " started";
    EXPECT_EQ(r.exit_code, 2) << Describe(r);
    EXPECT_THAT(r.err, HasSubstr(args[args.size() - 2] + " must be in 1..")) << Describe(r);
  }
  // In range, batching off: generation works.
  const CliResult ok = Run({"generate", "--prompt", "Once", "--max-tokens", "2", "--threads", "1",
                            "--max-batch-sessions", "1", "--prefill-chunk", "1"});
  EXPECT_EQ(ok.exit_code, 0) << Describe(ok);
}

// The front door's limits are range-checked before anything starts: exit 2
// naming the flag and its range.
TEST_F(CliHardeningTest, FrontDoorLimitsOutOfRangeExitTwo) {
  const std::vector<std::vector<std::string>> cases = {
      {"--head-timeout", "0"},
      {"--head-timeout", "-1"},
      {"--body-timeout", "3601"},
      {"--max-connections", "0"},
      {"--max-connections", "100001"},
      {"--max-connections-per-ip", "0"},
      {"--max-connections-per-ip", "600"},
  };
  for (const auto& flag : cases) {
    const CliResult r = Run({"api", "--listen", "127.0.0.1:0", flag[0], flag[1]});
    ASSERT_FALSE(r.timed_out) << flag[0] << " started";
    EXPECT_EQ(r.exit_code, 2) << Describe(r);
    EXPECT_THAT(r.err, HasSubstr(flag[0] + " must be in")) << Describe(r);
    EXPECT_THAT(r.out, Not(HasSubstr("listening on")));
  }
}

// --ggml-parity computes in llama.cpp's arithmetic: `meshnet generate` prints
// llama.cpp's greedy text for a preset of tests/data/quant (its
// reference_outputs.json); other KV dtypes are refused with exit code 2.
TEST_F(CliHardeningTest, GgmlParityGeneratesLlamaCppText) {
  const std::string dir = MESHNET_QUANT_DIR;
  const std::string name = "stories260K-Q5_K_S.gguf";
  std::ifstream in(dir + "/reference_outputs.json");
  const std::string want =
      nlohmann::json::parse(in)["outputs"][name]["Once upon a time"].get<std::string>();
  const std::string model = dir + "/" + name;
  auto run = [&](const std::string& dtype) {
    return Run({"generate", "--model", model, "--prompt", "Once upon a time", "--max-tokens", "64",
                "--threads", "1", "--shards", "2", "--ggml-parity", "--kv-dtype", dtype});
  };
  const CliResult r = run("f16");
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out, want) << Describe(r);
  const CliResult bad = run("f32");
  EXPECT_EQ(bad.exit_code, 2) << Describe(bad);
  EXPECT_THAT(bad.err, HasSubstr("needs an F16 KV cache")) << Describe(bad);
  const CliResult quant = run("q8_0");  // llama.cpp's default attention has no q8_0 V
  EXPECT_EQ(quant.exit_code, 2) << Describe(quant);
  EXPECT_THAT(quant.err, HasSubstr("needs an F16 KV cache (--kv-dtype f16), not q8_0"))
      << Describe(quant);
}

// MESHNET_DISABLE_SIMD: an unknown target exits 2 naming it and the
// machine's targets; leaving out the best one still generates.
TEST_F(CliHardeningTest, DisableSimdNamesTheMachinesTargets) {
  setenv("MESHNET_DISABLE_SIMD", "NOT_A_TARGET", 1);
  const CliResult bad = Run({"inspect", kModel});
  setenv("MESHNET_DISABLE_SIMD", ops::BestSimdTarget().c_str(), 1);
  const CliResult fewer =
      Run({"generate", "--model", kModel, "--prompt", "Once", "--max-tokens", "4"});
  unsetenv("MESHNET_DISABLE_SIMD");
  EXPECT_EQ(bad.exit_code, 2) << Describe(bad);
  EXPECT_THAT(bad.err, HasSubstr("'NOT_A_TARGET' is not one of this machine's")) << Describe(bad);
  EXPECT_THAT(bad.err, HasSubstr(ops::BestSimdTarget())) << Describe(bad);
  EXPECT_EQ(fewer.exit_code, 0) << Describe(fewer);
}

// In-process-only flags are an error with --nodes, not silently ignored.
TEST_F(CliHardeningTest, InProcessFlagsWithNodesAreAnError) {
  for (const char* flag :
       {"--kv-budget=1MiB", "--split=0-4", "--shards=2", "--max-batch-sessions=2"}) {
    const CliResult r = Run({"generate", "--prompt", "x", "--nodes", "127.0.0.1:1", flag});
    EXPECT_EQ(r.exit_code, 2) << Describe(r);
    EXPECT_THAT(r.err, HasSubstr(std::string(flag).substr(0, std::string(flag).find('='))))
        << Describe(r);
    EXPECT_THAT(r.err, HasSubstr("with --nodes")) << Describe(r);
  }
}

// A second node on a live node's port fails (SO_REUSEPORT off) instead of
// sharing its connections.
TEST_F(CliHardeningTest, PortInUseExitsTwo) {
  auto node = Serve();
  const CliResult r = Run({"serve", "--model", kModel, "--layers", "0-4", "--threads", "1",
                           "--listen", node->address()},
                          30);
  ASSERT_FALSE(r.timed_out) << "a second node bound a live node's port:\n" << Describe(r);
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("address in use")) << Describe(r);
}

// A node and a client that disagree on the model: refused at route planning
// (the client's tokenizer would map ids of another vocabulary).
TEST_F(CliHardeningTest, TokenizerModelMismatchIsRefused) {
  auto node = Serve();
  const std::string other = WriteModel("other.gguf");
  const CliResult r = Run({"generate", "--model", other, "--nodes", node->address(), "--prompt",
                           "Once", "--max-tokens", "2"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("tokenizer")) << Describe(r);
}

// A huge --timeout is clamped, not overflowed into a deadline in the past.
TEST_F(CliHardeningTest, HugeTimeoutIsClamped) {
  auto node = Serve();
  const CliResult r = Run({"generate", "--nodes", node->address(), "--prompt", "Once",
                           "--max-tokens", "3", "--timeout", "1e13", "--output", "json"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("\"generated_ids\":[")) << Describe(r);
}

// A plaintext client against a TLS node: the error says TLS may be the cause.
TEST_F(CliHardeningTest, TlsMismatchIsNamed) {
  const testing::TestPki pki = testing::MakeTestPki(dir_);
  auto node = Serve({"--tls-cert", pki.server_cert, "--tls-key", pki.server_key});
  const CliResult r =
      Run({"generate", "--nodes", node->address(), "--prompt", "Once", "--max-tokens", "2"});
  EXPECT_NE(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("--tls-ca")) << Describe(r);
}

// Opens a TCP connection to host:port and sends an unfinished HTTP request
// (no blank line): the server waits for the rest. Returns the fd.
int HalfOpenRequest(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  const std::string partial = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  (void)!send(fd, partial.data(), partial.size(), 0);
  return fd;
}

// Four half-open HTTP requests must not block /metrics (civetweb's default
// two threads with a 30 s read timeout did; HttpGet gives up after 5 s).
TEST_F(CliHardeningTest, HalfOpenRequestsDoNotBlockMetrics) {
  auto node = std::make_unique<NodeProcess>(
      MESHNET_BINARY,
      std::vector<std::string>{"--model", kModel, "--layers", "0-4", "--threads", "1",
                               "--metrics-listen", "127.0.0.1:0"},
      dir_.file("metrics.log"), /*expect_metrics=*/true);
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i) fds.push_back(HalfOpenRequest(node->metrics_address()));
  for (int fd : fds) EXPECT_GE(fd, 0);
  const std::string body = testing::HttpGet(node->metrics_address(), "/metrics");
  EXPECT_THAT(body, HasSubstr("meshnet_")) << "no /metrics answer while 4 requests were half-open";
  for (int fd : fds) close(fd);
}

}  // namespace
}  // namespace meshnet::rpc

namespace meshnet::rpc {
namespace {

// `meshnet generate` over a route with two replicas of its last range: the
// replica serving the session is stopped (SIGSTOP) mid-generation. The
// command fails over, prints the in-process text and exits while the node
// is still stopped: its release there does not hold the exit (was: the
// command waited until the node resumed). The node is resumed only after.
TEST_F(CliHardeningTest, GenerateExitsWhileAStoppedNodeStaysStopped) {
  const std::string model = dir_.file("m.gguf");
  const CliResult made = Run({"make-model", "--out", model, "--tokenizer-from", kModel, "--n-embd",
                              "512", "--n-layers", "8", "--n-heads", "8", "--n-ff", "1536",
                              "--type", "q8_0", "--context", "2048", "--seed", "7"});
  ASSERT_EQ(made.exit_code, 0) << Describe(made);
  const std::vector<std::string> gen = {"generate",         "--model",  model, "-p",
                                        "Once upon a time", "--no-bos", "-n",  "600",
                                        "--output",         "json"};
  std::vector<std::string> solo = gen;
  solo.insert(solo.end(), {"--shards", "1", "--threads", "1"});
  const CliResult want = Run(solo);
  ASSERT_EQ(want.exit_code, 0) << Describe(want);
  auto node = [&](const char* layers) {
    return std::make_unique<NodeProcess>(
        MESHNET_BINARY,
        std::vector<std::string>{"--model", model, "--layers", layers, "--threads", "1",
                                 "--metrics-listen", "127.0.0.1:0"},
        dir_.file("node-" + std::to_string(++n_) + ".log"), /*expect_metrics=*/true);
  };
  auto head = node("0-3");
  std::unique_ptr<NodeProcess> tails[2] = {node("4-7"), node("4-7")};
  std::vector<std::string> remote = gen;
  remote.insert(remote.end(),
                {"--nodes", head->address() + "," + tails[0]->address() + "," + tails[1]->address(),
                 "--timeout", "2"});
  NodeProcess* stopped = nullptr;
  const CliResult got = RunCli(MESHNET_BINARY, remote, kLimit, [&](pid_t) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (stopped == nullptr && std::chrono::steady_clock::now() < until) {
      for (auto& t : tails) {
        const std::string m = testing::HttpGet(t->metrics_address(), "/metrics");
        if (testing::MetricValue(m, "meshnet_kv_live_sessions") == 1) stopped = t.get();
      }
      // A metrics poll: the session starts in another process.
      if (stopped == nullptr) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (stopped != nullptr) kill(stopped->pid(), SIGSTOP);
  });
  ASSERT_NE(stopped, nullptr) << "no tail took the session\n" << Describe(got);
  std::ifstream stat("/proc/" + std::to_string(stopped->pid()) + "/stat");
  const std::string fields(std::istreambuf_iterator<char>(stat), {});
  const bool still_stopped = fields.find(") T ") != std::string::npos;  // state T: stopped
  kill(stopped->pid(), SIGCONT);
  ASSERT_FALSE(got.timed_out) << "generate waited for the stopped node\n" << Describe(got);
  ASSERT_EQ(got.exit_code, 0) << Describe(got);
  EXPECT_TRUE(still_stopped);
  const auto a = nlohmann::json::parse(want.out, nullptr, false);
  const auto b = nlohmann::json::parse(got.out, nullptr, false);
  ASSERT_TRUE(a.is_object() && b.is_object()) << Describe(got);
  EXPECT_EQ(b["generated_ids"], a["generated_ids"]);
  EXPECT_GE(b["generated_ids"].size(), 400u) << "too short a run to stop a node in";
}

// `meshnet admin` never sends the cluster token: without the admin token it
// stops before any call; `serve` refuses an admin token equal to the cluster
// token, and announcing itself from a wildcard address it cannot prove.
TEST(CliTrust, AdminAndServeRefuseWeakOrUnprovableSettings) {
  using testing::RunCli;
  const testing::CliResult no_admin =
      RunCli(MESHNET_BINARY, {"admin", "drain", "127.0.0.1:1", "--to", "127.0.0.1:2"}, 30);
  EXPECT_EQ(no_admin.exit_code, 2) << no_admin.err;
  EXPECT_NE(no_admin.err.find("admin token"), std::string::npos) << no_admin.err;
  const testing::CliResult same = RunCli(
      MESHNET_BINARY,
      {"serve", "--model", kModel, "--layers", "0-4", "--auth-token", "t", "--admin-token", "t"},
      30);
  EXPECT_EQ(same.exit_code, 2) << same.err;
  EXPECT_NE(same.err.find("--admin-token must differ"), std::string::npos) << same.err;
  const testing::CliResult wildcard =
      RunCli(MESHNET_BINARY,
             {"serve", "--model", kModel, "--layers", "0-4", "--listen", "0.0.0.0:0", "--insecure",
              "--registry", "127.0.0.1:1"},
             60);
  EXPECT_EQ(wildcard.exit_code, 2) << wildcard.err;
  EXPECT_NE(wildcard.err.find("cannot announce itself"), std::string::npos) << wildcard.err;
}

}  // namespace
}  // namespace meshnet::rpc
