// Batch invariance as a user sees it: on generated 768-dim models (F32,
// Q8_0, Q4_0, Q4_K, Q6_K), 16 concurrent greedy sessions of `meshnet generate
// --sessions 16` over one `meshnet serve` node and over three each equal the
// solo run over the same nodes. Q8_0 and Q4_0 run again with the AVX-512
// targets left out (MESHNET_DISABLE_SIMD, inherited by every child), the
// AVX2 kernels where sessions used to diverge from their solo runs. Children
// are killed and reaped in teardown; every wait is bounded.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ops/simd_targets.h"
#include "rpc/test_util.h"
#include "tests/rpc/cli_run.h"
#include "tests/rpc/node_process.h"

namespace meshnet::rpc {
namespace {

using testing::NodeProcess;
using testing::RunCli;

constexpr double kTimeoutS = 120;

// `meshnet generate` over `nodes`: the JSON of one run (`sessions` 0: solo).
nlohmann::json Generate(const std::string& model, const std::string& nodes, int sessions) {
  std::vector<std::string> args = {
      "generate", "--model",      model, "--nodes",  nodes, "--prompt", "Once upon a time number 1",
      "--no-bos", "--max-tokens", "24",  "--output", "json"};
  if (sessions > 0) args.insert(args.end(), {"--sessions", std::to_string(sessions)});
  const auto r = RunCli(MESHNET_BINARY, args, kTimeoutS);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
}

// Serves `model` split as `splits` and checks 16 sessions against the solo run.
void ExpectSixteenEqualSolo(const rpc::testing::ScratchDir& dir, const std::string& model,
                            const std::vector<std::string>& splits) {
  std::vector<std::unique_ptr<NodeProcess>> nodes;
  std::string csv;
  for (const std::string& layers : splits) {
    nodes.push_back(std::make_unique<NodeProcess>(
        MESHNET_BINARY,
        std::vector<std::string>{"--model", model, "--layers", layers, "--listen", "127.0.0.1:0",
                                 "--threads", "1", "--max-sessions", "32"},
        dir.file("node-" + layers + ".log")));
    csv += (csv.empty() ? "" : ",") + nodes.back()->address();
  }
  const nlohmann::json solo = Generate(model, csv, 0);
  ASSERT_EQ(solo["generated_ids"].size(), 24u);
  const nlohmann::json load = Generate(model, csv, 16);
  ASSERT_EQ(load["sessions"].size(), 16u);
  for (const auto& s : load["sessions"]) {
    EXPECT_EQ(s["generated_ids"], solo["generated_ids"]) << splits.size() << " node(s)";
  }
}

// The AVX-512 targets this machine has, comma-separated ("" if none).
std::string Avx512Targets() {
  const std::string all = " " + ops::AvailableSimdTargets() + " ";
  std::string out;
  for (const char* t : {"AVX3_DL", "AVX3"}) {
    if (all.find(" " + std::string(t) + " ") != std::string::npos) {
      out += (out.empty() ? "" : ",") + std::string(t);
    }
  }
  return out;
}

// MESHNET_DISABLE_SIMD for the children started in its scope (none if empty).
struct DisabledSimd {
  explicit DisabledSimd(const std::string& targets) {
    if (!targets.empty()) setenv("MESHNET_DISABLE_SIMD", targets.c_str(), 1);
  }
  ~DisabledSimd() { unsetenv("MESHNET_DISABLE_SIMD"); }
};

// without_avx512: run every process with the AVX-512 targets left out.
void CheckType(const std::string& type, bool without_avx512 = false) {
  const std::string avx512 = without_avx512 ? Avx512Targets() : "";
  if (without_avx512 && avx512.empty()) {
    std::printf("no AVX-512 target here: the default run already took the AVX2 kernels\n");
    return;
  }
  const DisabledSimd scope(avx512);
  rpc::testing::ScratchDir dir;
  const std::string model = dir.file("m.gguf");
  const auto made = RunCli(MESHNET_BINARY,
                           {"make-model", "--out", model, "--tokenizer-from", MESHNET_SHIPPED_MODEL,
                            "--n-embd", "768", "--n-layers", "3", "--n-heads", "12", "--n-kv-heads",
                            "4", "--n-ff", "2048", "--type", type, "--seed", "7"},
                           kTimeoutS);
  ASSERT_EQ(made.exit_code, 0) << made.err;
  ExpectSixteenEqualSolo(dir, model, {"0-2"});
  ExpectSixteenEqualSolo(dir, model, {"0-0", "1-1", "2-2"});
}

TEST(BatchInvarianceProcess, F32) { CheckType("f32"); }
TEST(BatchInvarianceProcess, Q8_0) { CheckType("q8_0"); }
TEST(BatchInvarianceProcess, Q4_0) { CheckType("q4_0"); }
TEST(BatchInvarianceProcess, Q4_K) { CheckType("q4_k"); }
TEST(BatchInvarianceProcess, Q6_K) { CheckType("q6_k"); }
TEST(BatchInvarianceProcess, Q8_0OnAvx2) { CheckType("q8_0", /*without_avx512=*/true); }
TEST(BatchInvarianceProcess, Q4_0OnAvx2) { CheckType("q4_0", /*without_avx512=*/true); }

}  // namespace
}  // namespace meshnet::rpc
