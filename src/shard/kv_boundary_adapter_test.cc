// The adapter on the shipped model: the boundary contract (every check the
// reference makes), cached prefill/decode through the manager, and explicit
// misses at resolve and at commit.
#include "shard/kv_boundary_adapter.h"

#include <gtest/gtest.h>

#include "util/error.h"
#include "util/thread_pool.h"

namespace meshnet::shard {
namespace {

const std::string kModel = std::string(MESHNET_SOURCE_DIR) + "/models/stories260K.gguf";

struct Fixture : ::testing::Test {
  std::shared_ptr<const gguf::GgufFile> file =
      std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(kModel));
  ThreadPool pool{2};
  LlamaShard head{file, 0, 1, &pool};
  LlamaShard middle{file, 2, 3, &pool};
  LlamaShard tail{file, 4, 4, &pool};
  kv::HotKvStateManager head_kv{head.MakeRecipe(KvDtype::kF32), {}};
  kv::HotKvStateManager middle_kv{middle.MakeRecipe(KvDtype::kF32), {}};
  kv::HotKvStateManager tail_kv{tail.MakeRecipe(KvDtype::kF32), {}};
  KvBoundaryAdapter h{&head, &head_kv};
  KvBoundaryAdapter m{&middle, &middle_kv};
  KvBoundaryAdapter t{&tail, &tail_kv};
  std::vector<int32_t> prompt = {1, 403, 407, 261, 378};

  StepInput Tokens(const std::vector<int32_t>& ids) {
    StepInput in;
    in.token_ids = std::span<const int32_t>(ids);
    return in;
  }
  static StepInput Bundle(BoundaryBundle* b) {
    StepInput in;
    in.bundle = b;
    return in;
  }
  BoundaryBundle HeadBundle(const std::string& sid) {
    return std::get<BoundaryBundle>(h.Prefill(sid, 0, Tokens(prompt), {}));
  }
};

ErrorKind KindOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.kind();
  }
  return ErrorKind::kUnavailable;  // "nothing thrown"
}

TEST_F(Fixture, RolesAndBundleFields) {
  EXPECT_TRUE(h.role().is_head());
  EXPECT_FALSE(m.role().is_head() || m.role().is_tail());
  EXPECT_TRUE(t.role().is_tail());
  BoundaryBundle b = HeadBundle("s");
  EXPECT_EQ(b.architecture_adapter, "llama");
  EXPECT_EQ(b.schema_version, 1);
  EXPECT_EQ(b.tensor_name, "residual");
  EXPECT_EQ(b.next_layer, 2);
  EXPECT_FALSE(b.normalized);
  EXPECT_EQ(b.n_tokens, 5);
  EXPECT_EQ(b.n_embd, 64);
  EXPECT_EQ(b.positions, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(head_kv.Get("s", 0).seq_len(), 5);
}

TEST_F(Fixture, ContractViolationsAreRefusedAndChangeNothing) {
  BoundaryBundle good = HeadBundle("s");
  // Head without tokens, head given a bundle.
  EXPECT_EQ(KindOf([&] { h.Prefill("x", 0, StepInput{}, {}); }), ErrorKind::kBoundaryContract);
  EXPECT_EQ(KindOf([&] {
              BoundaryBundle b = good;
              StepInput in = Tokens(prompt);
              in.bundle = &b;
              h.Prefill("x", 0, in, {});
            }),
            ErrorKind::kBoundaryContract);
  // Middle or tail given tokens.
  EXPECT_EQ(KindOf([&] { m.Prefill("x", 0, Tokens(prompt), {}); }), ErrorKind::kBoundaryContract);
  EXPECT_EQ(KindOf([&] { t.Prefill("x", 0, Tokens(prompt), {}); }), ErrorKind::kBoundaryContract);
  // Wrong architecture, schema, tensor name, next layer; a normalized bundle.
  std::vector<std::function<void(BoundaryBundle&)>> breakers = {
      [](BoundaryBundle& b) { b.architecture_adapter = "mistral"; },
      [](BoundaryBundle& b) { b.schema_version = 9; },
      [](BoundaryBundle& b) { b.tensor_name = "hidden_states"; },
      [](BoundaryBundle& b) { b.next_layer = 3; },
      [](BoundaryBundle& b) { b.normalized = true; },
  };
  for (auto& breaker : breakers) {
    BoundaryBundle b = good;
    breaker(b);
    EXPECT_EQ(KindOf([&] { m.Prefill("x", 0, Bundle(&b), {}); }), ErrorKind::kBoundaryContract);
  }
  // Nothing was opened for "x" anywhere.
  EXPECT_EQ(middle_kv.SessionCount(), 0);
  EXPECT_EQ(head_kv.SessionCount(), 1);
  // A bad bundle for a live session leaves it as it was.
  BoundaryBundle ok = good;
  ASSERT_TRUE(std::holds_alternative<BoundaryBundle>(m.Prefill("s", 0, Bundle(&ok), {})));
  BoundaryBundle bad = good;
  bad.next_layer = 4;
  EXPECT_THROW(m.Prefill("s", 0, Bundle(&bad), {}), Error);
  EXPECT_EQ(middle_kv.Get("s", 0).seq_len(), 5);
}

TEST_F(Fixture, DecodeMissesWhenStateIsGoneAtResolve) {
  BoundaryBundle b = HeadBundle("s");
  ASSERT_TRUE(std::holds_alternative<BoundaryBundle>(m.Prefill("s", 0, Bundle(&b), {})));
  middle_kv.Release("s", 0);
  std::vector<int32_t> one = {432};
  BoundaryBundle next = std::get<BoundaryBundle>(h.Decode("s", 0, Tokens(one), 5, {}));
  StepOutput out = m.Decode("s", 0, Bundle(&next), 5, {});
  ASSERT_TRUE(std::holds_alternative<kv::CacheMiss>(out));
  EXPECT_EQ(std::get<kv::CacheMiss>(out).reason, kv::CacheMissReason::kReleased);
  // Wrong expected length: seq-len-mismatch miss, and the state is dropped.
  StepOutput mismatch = h.Decode("s", 0, Tokens(one), 3, {});
  ASSERT_TRUE(std::holds_alternative<kv::CacheMiss>(mismatch));
  EXPECT_EQ(std::get<kv::CacheMiss>(mismatch).reason, kv::CacheMissReason::kSeqLenMismatch);
}

TEST_F(Fixture, TailSamplesFromTheLastRowOnly) {
  BoundaryBundle b = HeadBundle("s");
  BoundaryBundle b2 = std::get<BoundaryBundle>(m.Prefill("s", 0, Bundle(&b), {}));
  StepOutput out = t.Prefill("s", 0, Bundle(&b2), {});
  const TailOutput& tail_out = std::get<TailOutput>(out);
  EXPECT_EQ(tail_out.logits.size(), 512u);
  EXPECT_EQ(tail_out.token_id, 432);  // ',' per models/README.md
}

TEST_F(Fixture, IncompatibleManagerIsRefused) {
  kv::HotKvStateManager f16{middle.MakeRecipe(KvDtype::kF16), {}};
  EXPECT_EQ(KindOf([&] { KvBoundaryAdapter bad(&head, &f16); }), ErrorKind::kIncompatibleRecipe);
}

TEST_F(Fixture, OutOfVocabularyTokenIsInvalidArgument) {
  std::vector<int32_t> bad = {1, 99999};
  EXPECT_EQ(KindOf([&] { h.Prefill("y", 0, Tokens(bad), {}); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(head_kv.SessionCount(), 0);
}

}  // namespace
}  // namespace meshnet::shard
