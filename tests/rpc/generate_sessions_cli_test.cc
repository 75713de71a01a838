// `meshnet generate --sessions N` (the load mode) as a user runs it: every
// session's ids equal the solo `meshnet generate` run of the same prompt, in
// process and over three `meshnet serve` nodes; the aggregate figures are
// printed; an out-of-range count exits 2. Children are killed and reaped in
// teardown; every wait is bounded.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "rpc/test_util.h"
#include "tests/rpc/cli_run.h"
#include "tests/rpc/node_process.h"

namespace meshnet::rpc {
namespace {

using testing::NodeProcess;
using testing::RunCli;

const std::string kModel = MESHNET_SHIPPED_MODEL;
constexpr double kTimeoutS = 120;
const std::vector<std::string> kBase = {"generate", "--model",          kModel,
                                        "--prompt", "Once upon a time", "--max-tokens",
                                        "20",       "--output",         "json"};

std::vector<std::string> With(std::vector<std::string> extra) {
  std::vector<std::string> args = kBase;
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// Checks the load run's JSON against the solo run's ids.
void ExpectSessionsEqualSolo(const std::vector<std::string>& route_flags, int n) {
  const auto solo = RunCli(MESHNET_BINARY, With(route_flags), kTimeoutS);
  ASSERT_EQ(solo.exit_code, 0) << solo.err;
  const auto want = nlohmann::json::parse(solo.out)["generated_ids"];
  ASSERT_EQ(want.size(), 20u);
  auto args = route_flags;
  args.insert(args.end(), {"--sessions", std::to_string(n)});
  const auto load = RunCli(MESHNET_BINARY, With(args), kTimeoutS);
  ASSERT_EQ(load.exit_code, 0) << load.err;
  const auto got = nlohmann::json::parse(load.out);
  ASSERT_EQ(got["sessions"].size(), static_cast<size_t>(n));
  for (const auto& s : got["sessions"]) {
    EXPECT_EQ(s["generated_ids"], want);
    EXPECT_EQ(s["text"], nlohmann::json::parse(solo.out)["text"]);
    EXPECT_GE(s["ttft_ms"].get<double>(), 0.0);
  }
  const auto& a = got["aggregate"];
  EXPECT_EQ(a["tokens"], 20 * n);
  EXPECT_EQ(a["failed"], 0);
  EXPECT_GT(a["tokens_per_s"].get<double>(), 0.0);
  EXPECT_GE(a["inter_token_ms"]["p99"].get<double>(), a["inter_token_ms"]["p50"].get<double>());
}

TEST(GenerateSessionsCli, InProcessSessionsEqualTheSoloRun) { ExpectSessionsEqualSolo({}, 8); }

// Three `meshnet serve` nodes (layers 0-1, 2-3, 4-4) on 127.0.0.1.
struct ThreeNodes {
  rpc::testing::ScratchDir dir;
  std::vector<std::unique_ptr<NodeProcess>> nodes;
  std::string csv;  // their addresses, for --nodes
  ThreeNodes() {
    for (const char* layers : {"0-1", "2-3", "4-4"}) {
      nodes.push_back(std::make_unique<NodeProcess>(
          MESHNET_BINARY,
          std::vector<std::string>{"--model", kModel, "--layers", layers, "--listen", "127.0.0.1:0",
                                   "--threads", "1", "--max-sessions", "16"},
          dir.file(std::string("node-") + layers + ".log")));
      csv += (csv.empty() ? "" : ",") + nodes.back()->address();
    }
  }
};

TEST(GenerateSessionsCli, OverThreeNodesSessionsEqualTheSoloRun) {
  ThreeNodes mesh;
  ExpectSessionsEqualSolo({"--nodes", mesh.csv}, 8);
}

// --prompt-chunk: the prompt in pipelined pieces of 2 tokens, in process and
// over three nodes (one session and three at once), gives the ids of the
// prompt sent whole; a negative size is refused.
TEST(GenerateSessionsCli, PromptChunksGiveTheWholePromptsIds) {
  const auto whole = RunCli(MESHNET_BINARY, With({"--prompt-chunk", "0"}), kTimeoutS);
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const auto want = nlohmann::json::parse(whole.out)["generated_ids"];
  ASSERT_EQ(want.size(), 20u);
  const auto local = RunCli(MESHNET_BINARY, With({"--prompt-chunk", "2"}), kTimeoutS);
  ASSERT_EQ(local.exit_code, 0) << local.err;
  EXPECT_EQ(nlohmann::json::parse(local.out)["generated_ids"], want);

  ThreeNodes mesh;
  const std::string& csv = mesh.csv;
  const auto remote =
      RunCli(MESHNET_BINARY, With({"--nodes", csv, "--prompt-chunk", "2"}), kTimeoutS);
  ASSERT_EQ(remote.exit_code, 0) << remote.err;
  EXPECT_EQ(nlohmann::json::parse(remote.out)["generated_ids"], want);
  const auto load = RunCli(
      MESHNET_BINARY, With({"--nodes", csv, "--prompt-chunk", "2", "--sessions", "3"}), kTimeoutS);
  ASSERT_EQ(load.exit_code, 0) << load.err;
  const auto sessions = nlohmann::json::parse(load.out)["sessions"];
  ASSERT_EQ(sessions.size(), 3u) << load.out;
  for (const auto& s : sessions) {
    EXPECT_EQ(s["generated_ids"], want);
  }

  const auto bad = RunCli(MESHNET_BINARY, With({"--prompt-chunk", "-1"}), kTimeoutS);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--prompt-chunk"), std::string::npos) << bad.err;
}

TEST(GenerateSessionsCli, TextModePrintsEverySessionAndTheAggregate) {
  auto args = kBase;
  args.resize(args.size() - 2);  // without --output json: text
  args.insert(args.end(), {"--sessions", "3"});
  const auto r = RunCli(MESHNET_BINARY, args, kTimeoutS);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* line : {"session 0: 20 tokens", "session 1: 20 tokens", "session 2: 20 tokens",
                           "sessions 3, failed 0, tokens 60", "tokens/s", "inter-token p50"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
}

TEST(GenerateSessionsCli, OutOfRangeCountExitsTwo) {
  for (const char* n : {"0", "-3", "1025"}) {
    const auto r = RunCli(MESHNET_BINARY, With({"--sessions", n}), kTimeoutS);
    EXPECT_EQ(r.exit_code, 2) << n << ": " << r.err;
    EXPECT_NE(r.err.find("--sessions must be in 1..1024"), std::string::npos) << r.err;
  }
  const auto r =
      RunCli(MESHNET_BINARY, With({"--sessions", "2", "--dump-logits", "/dev/null"}), kTimeoutS);
  EXPECT_EQ(r.exit_code, 2) << r.err;
}

}  // namespace
}  // namespace meshnet::rpc
