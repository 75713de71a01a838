// The per-peer limit on sessions opened per minute (issue 8, secure by
// default), on a `meshnet serve` child under mutual TLS: a peer is the
// identity of its client certificate, so two clients on 127.0.0.1 are two
// peers. Over the limit a new session gets RESOURCE_EXHAUSTED with a retry
// hint; the peer's open sessions and other peers go on.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <variant>

#include "node/identity.h"
#include "rpc/remote.h"
#include "rpc/test_util.h"
#include "tests/rpc/cli_run.h"
#include "tests/rpc/node_process.h"
#include "util/error.h"

namespace meshnet::rpc {
namespace {

using ::testing::HasSubstr;
using testing::NodeProcess;

const std::string kModel = MESHNET_SHIPPED_MODEL;

// A second client certificate ("second-client") signed by the test CA.
void MakeSecondClient(const testing::ScratchDir& dir) {
  const std::string d = dir.path().string();
  const std::string sh =
      "cd '" + d +
      "' && set -e && openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
      "-nodes -keyout client2.key -out client2.csr -subj /CN=second-client && openssl x509 -req "
      "-in client2.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile client.ext "
      "-out client2.pem >/dev/null 2>&1";
  if (std::system(sh.c_str()) != 0) throw std::runtime_error("openssl failed: " + sh);
}

mesh::StepRequest Prefill(const std::string& session_id) {
  mesh::StepRequest r;
  r.session_id = session_id;
  r.session_secret = "s";
  r.prefill = true;
  r.token_ids = {1, 403, 407, 261};
  return r;
}

// The error of a step, or "" if it succeeded.
std::string StepError(RemoteEndpoint& ep, const mesh::StepRequest& r, ErrorKind* kind = nullptr) {
  try {
    ep.Step(r);
    return "";
  } catch (const Error& e) {
    if (kind) *kind = e.kind();
    return e.what();
  }
}

TEST(PeerLimitsTest, NewSessionsPerMinuteArePerPeer) {
  testing::ScratchDir dir;
  const testing::TestPki pki = testing::MakeTestPki(dir);
  MakeSecondClient(dir);
  NodeProcess node(MESHNET_BINARY,
                   {"--model", kModel, "--layers", "0-4", "--listen", "127.0.0.1:0", "--threads",
                    "1", "--tls-cert", pki.server_cert, "--tls-key", pki.server_key, "--tls-ca",
                    pki.ca_cert, "--max-new-sessions-per-minute", "3"},
                   dir.file("node.log"));
  ClientOptions a;
  a.tls_ca = pki.ca_cert;
  a.tls_cert = pki.client_cert;
  a.tls_key = pki.client_key;
  a.info_timeout_s = 10.0;
  a.connect_timeout_s = 5.0;
  a.step_retries = 0;
  ClientOptions b = a;
  b.tls_cert = dir.file("client2.pem");
  b.tls_key = dir.file("client2.key");
  RemoteEndpoint ep_a(node.address(), a), ep_b(node.address(), b);

  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(node::RandomId128());
    ASSERT_EQ(StepError(ep_a, Prefill(ids.back())), "") << "session " << i;
  }
  ErrorKind kind = ErrorKind::kInvalidArgument;
  const std::string refused = StepError(ep_a, Prefill(node::RandomId128()), &kind);
  EXPECT_EQ(kind, ErrorKind::kResourceExhausted) << refused;
  EXPECT_THAT(refused, HasSubstr("too many new sessions from x509:meshnet-client"));
  EXPECT_THAT(refused, HasSubstr("(limit 3 per minute); retry in"));

  // The limited peer's open sessions go on: a decode step and a re-prefill.
  mesh::StepRequest decode = Prefill(ids[0]);
  decode.prefill = false;
  decode.expected_seq_len = 4;
  decode.token_ids = {300};
  EXPECT_EQ(StepError(ep_a, decode), "");
  EXPECT_EQ(StepError(ep_a, Prefill(ids[1])), "") << "a re-prefill is not a new session";
  // Another peer (another certificate, the same address) opens its own.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(StepError(ep_b, Prefill(node::RandomId128())), "");
  EXPECT_EQ(ep_b.InfoFull().shard.end_layer, 4);
}

// The flag's range is checked before the node starts: exit 2, the range named.
TEST(PeerLimitsTest, NewSessionsPerMinuteFlagIsBounded) {
  for (const char* bad : {"0", "-5", "1000001"}) {
    const testing::CliResult r = testing::RunCli(
        MESHNET_BINARY,
        {"serve", "--model", kModel, "--layers", "0-4", "--max-new-sessions-per-minute", bad}, 30);
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("--max-new-sessions-per-minute must be in 1..1000000")) << bad;
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("listening on")));
  }
}

}  // namespace
}  // namespace meshnet::rpc
