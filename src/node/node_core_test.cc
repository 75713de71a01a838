// NodeCore on node-level types, on the shipped stories260K model (5 layers):
// the in-process Node answers the same as the core, retries are answered from
// the cache without running twice, bindings check the secret. The wire-level
// cases are in rpc/node_service_test.cc.
#include "node/node_core.h"

#include <gtest/gtest.h>

#include <memory>

#include "gguf/gguf_reader.h"
#include "node/identity.h"
#include "node/node.h"
#include "node/node_test_util.h"

namespace meshnet::node {
namespace {

std::shared_ptr<const gguf::GgufFile> File() { return ShippedFile(); }

StepRequest Prefill(const std::string& id, std::vector<int32_t> tokens, uint64_t step) {
  StepRequest r;
  r.session_id = id;
  r.session_secret = "s";
  r.step_id = step;
  r.prefill = true;
  r.token_ids = std::move(tokens);
  return r;
}

const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378, 429};

TEST(NodeCore, AnswersLikeTheNodeAndReplaysRetries) {
  NodeOptions o;
  o.layers = LayerRange{0, 4};
  Node reference(File(), o, nullptr);
  Node node(File(), o, nullptr);
  NodeCore core(&node);
  const std::string id = RandomId128();
  StepRequest direct = Prefill(id, kPrompt, 1);
  const StepResult want = reference.Step(direct);
  ASSERT_TRUE(std::holds_alternative<shard::TailOutput>(want));

  const StepReply first = core.Step(Prefill(id, kPrompt, 1));
  ASSERT_TRUE(std::holds_alternative<shard::TailOutput>(first.result));
  EXPECT_FALSE(first.replayed);
  EXPECT_EQ(std::get<shard::TailOutput>(first.result).token_id,
            std::get<shard::TailOutput>(want).token_id);
  EXPECT_EQ(std::get<shard::TailOutput>(first.result).logits,
            std::get<shard::TailOutput>(want).logits);

  const StepReply again = core.Step(Prefill(id, kPrompt, 1));
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(std::get<shard::TailOutput>(again.result).logits,
            std::get<shard::TailOutput>(first.result).logits);
  EXPECT_EQ(core.counters().steps_replayed.load(), 1);
  EXPECT_EQ(core.counters().steps_tail.load(), 1);

  // The same step id with another reply format is another request.
  EXPECT_THROW(core.Step(Prefill(id, kPrompt, 1), ReplyFormat{KvDtype::kF32, false}), Error);
}

// Park (a client keeping its session for a later request): only with the
// session's secret; the state stays and continues, and its admission slot
// is free at once (it was active until then).
TEST(NodeCore, ParkKeepsTheStateAndFreesTheAdmissionSlot) {
  NodeOptions o;
  o.layers = LayerRange{0, 4};
  Node node(File(), o, nullptr);
  NodeCore core(&node);
  const std::string id = RandomId128();
  ASSERT_TRUE(std::holds_alternative<shard::TailOutput>(core.Step(Prefill(id, kPrompt, 1)).result));
  EXPECT_EQ(core.admission().active(), 1);
  EXPECT_THROW(core.Park(id, "wrong", 0), Error);  // kPermissionDenied, as Release
  EXPECT_EQ(core.admission().active(), 1);
  EXPECT_TRUE(core.Park(id, "s", 0));
  EXPECT_EQ(core.admission().active(), 0);
  EXPECT_EQ(std::get<int64_t>(core.Truncate(id, "s", 0, 4)), 4);
  StepRequest next;
  next.session_id = id;
  next.session_secret = "s";
  next.step_id = 2;
  next.expected_seq_len = 4;
  next.token_ids = {kPrompt[4], kPrompt[5]};
  EXPECT_TRUE(std::holds_alternative<shard::TailOutput>(core.Step(std::move(next)).result));
  EXPECT_FALSE(core.Park(RandomId128(), "s", 0));
}

TEST(NodeCore, BindingsCheckTheSecretAndUnboundSessionsMiss) {
  NodeOptions o;
  o.layers = LayerRange{0, 1};
  Node node(File(), o, nullptr);
  NodeCore core(&node);
  const std::string id = RandomId128();
  ASSERT_TRUE(
      std::holds_alternative<shard::BoundaryBundle>(core.Step(Prefill(id, kPrompt, 1)).result));
  StepRequest thief = Prefill(id, kPrompt, 2);
  thief.session_secret = "other";
  try {
    core.Step(thief);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied);
  }
  const TruncateReply t = core.Truncate(id, "s", 0, 2);
  ASSERT_TRUE(std::holds_alternative<int64_t>(t));
  EXPECT_EQ(std::get<int64_t>(t), 2);
  EXPECT_TRUE(core.Release(id, "s", 0));
  EXPECT_EQ(core.bindings(), 0);

  StepRequest decode = Prefill(id, {5}, 3);
  decode.prefill = false;
  decode.expected_seq_len = 2;
  const StepReply miss = core.Step(decode);
  ASSERT_TRUE(std::holds_alternative<kv::CacheMiss>(miss.result));
  EXPECT_EQ(std::get<kv::CacheMiss>(miss.result).reason, kv::CacheMissReason::kUnknownSession);
}

}  // namespace
}  // namespace meshnet::node
