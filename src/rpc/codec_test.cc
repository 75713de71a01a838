#include "rpc/codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "rpc/status.h"
#include "util/crc32c.h"
#include "util/error.h"

namespace meshnet::rpc {
namespace {

using ::testing::HasSubstr;

shard::BoundaryBundle MakeBundle(int64_t n_tokens, int64_t n_embd, int64_t start_pos) {
  shard::BoundaryBundle b;
  b.architecture_adapter = "llama";
  b.tensor_name = "residual";
  b.n_tokens = n_tokens;
  b.n_embd = n_embd;
  b.next_layer = 3;
  for (int64_t i = 0; i < n_tokens * n_embd; ++i) {
    b.residual.push_back(std::sin(0.37f * static_cast<float>(i)) * 3.0f);
  }
  for (int64_t i = 0; i < n_tokens; ++i) b.positions.push_back(start_pos + i);
  return b;
}

void ExpectThrowsKind(const std::function<void()>& f, ErrorKind kind, const char* needle) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_THAT(e.what(), HasSubstr(needle));
  }
}

TEST(CodecTest, F32RoundTripIsExact) {
  const shard::BoundaryBundle b = MakeBundle(3, 8, 5);
  pb::BoundaryBundle wire;
  EncodeBundle(b, 7, KvDtype::kF32, &wire);
  EXPECT_EQ(wire.payload().size(), 3u * 8 * 4);
  EXPECT_EQ(wire.crc32c(), Crc32c(wire.payload()));
  EXPECT_EQ(wire.route_epoch(), 7);
  const shard::BoundaryBundle back = DecodeBundle(wire, 7);
  EXPECT_EQ(back.residual, b.residual);
  EXPECT_EQ(back.positions, b.positions);
  EXPECT_EQ(back.next_layer, 3);
  EXPECT_EQ(back.architecture_adapter, "llama");
  EXPECT_EQ(back.tensor_name, "residual");
  EXPECT_FALSE(back.normalized);
}

TEST(CodecTest, HalfDtypesRoundToTheScalarReference) {
  const shard::BoundaryBundle b = MakeBundle(2, 16, 0);
  for (KvDtype t : {KvDtype::kF16, KvDtype::kBF16}) {
    pb::BoundaryBundle wire;
    EncodeBundle(b, 0, t, &wire);
    EXPECT_EQ(wire.payload().size(), 2u * 16 * 2);
    const shard::BoundaryBundle back = DecodeBundle(wire, 0);
    for (size_t i = 0; i < b.residual.size(); ++i) {
      const float want = t == KvDtype::kF16 ? HalfToFloat(FloatToHalf(b.residual[i]))
                                            : Bf16ToFloat(FloatToBf16(b.residual[i]));
      EXPECT_EQ(back.residual[i], want) << i;
    }
  }
}

TEST(CodecTest, RejectsMalformedBundles) {
  const shard::BoundaryBundle b = MakeBundle(2, 8, 0);
  pb::BoundaryBundle good;
  EncodeBundle(b, 4, KvDtype::kF32, &good);

  pb::BoundaryBundle w = good;
  (*w.mutable_payload())[5] ^= 0x10;
  ExpectThrowsKind([&] { DecodeBundle(w, 4); }, ErrorKind::kInvalidArgument, "checksum");

  w = good;
  w.set_n_tokens(3);
  ExpectThrowsKind([&] { DecodeBundle(w, 4); }, ErrorKind::kInvalidArgument, "needs");

  w = good;
  w.set_dtype(pb::DTYPE_F16);  // payload is f32-sized: size disagrees
  ExpectThrowsKind([&] { DecodeBundle(w, 4); }, ErrorKind::kInvalidArgument, "needs");

  w = good;
  w.set_dtype(static_cast<pb::Dtype>(9));
  ExpectThrowsKind([&] { DecodeBundle(w, 4); }, ErrorKind::kInvalidArgument, "dtype");

  w = good;
  w.set_dtype(pb::DTYPE_UNSPECIFIED);
  ExpectThrowsKind([&] { DecodeBundle(w, 4); }, ErrorKind::kInvalidArgument, "dtype");

  // The quantized types name a KV export's dtype, never a bundle's.
  for (pb::Dtype kv_only : {pb::DTYPE_Q8_0, pb::DTYPE_Q4_0}) {
    w = good;
    w.set_dtype(kv_only);
    ExpectThrowsKind([&] { DecodeBundle(w, 4); }, ErrorKind::kInvalidArgument, "dtype");
  }
  EXPECT_EQ(FromWireKvDtype(pb::DTYPE_Q8_0), KvDtype::kQ8_0);
  EXPECT_EQ(FromWireKvDtype(ToWireDtype(KvDtype::kQ4_0)), KvDtype::kQ4_0);
  EXPECT_EQ(FromWireKvDtype(pb::DTYPE_F16), KvDtype::kF16);

  w = good;
  w.add_positions(2);
  ExpectThrowsKind([&] { DecodeBundle(w, 4); }, ErrorKind::kInvalidArgument, "positions");

  ExpectThrowsKind([&] { DecodeBundle(good, 5); }, ErrorKind::kInvalidArgument, "epoch");

  w = good;
  w.set_n_embd(0);
  ExpectThrowsKind([&] { DecodeBundle(w, 4); }, ErrorKind::kInvalidArgument, "positive");

  w = good;
  w.set_n_tokens(int64_t{1} << 40);
  ExpectThrowsKind([&] { DecodeBundle(w, 4); }, ErrorKind::kInvalidArgument, "too large");
}

TEST(CodecTest, StepRequestRoundTripAndValidation) {
  node::StepRequest r;
  r.session_id = std::string(32, 'a');
  r.session_secret = "s3cret";
  r.route_epoch = 2;
  r.step_id = 9;
  r.expected_seq_len = 4;
  r.bundle = MakeBundle(1, 8, 4);
  r.sampling.temperature = 0.5f;
  r.sampling.top_k = 3;
  r.sampling.seed = 11;
  r.route_hops = 3;
  r.rewind = true;
  r.verify = true;
  pb::StepRequest wire;
  EncodeStepRequest(r, KvDtype::kF32, KvDtype::kBF16, false, &wire);
  EXPECT_EQ(wire.output_dtype(), pb::DTYPE_BF16);
  EXPECT_TRUE(wire.omit_logits());
  const node::StepRequest back = DecodeStepRequest(wire);
  EXPECT_EQ(back.session_id, r.session_id);
  EXPECT_EQ(back.session_secret, "s3cret");
  EXPECT_EQ(back.route_epoch, 2);
  EXPECT_EQ(back.step_id, 9u);
  EXPECT_EQ(back.expected_seq_len, std::optional<int64_t>(4));
  ASSERT_TRUE(back.bundle.has_value());
  EXPECT_EQ(back.bundle->residual, r.bundle->residual);
  EXPECT_EQ(back.sampling.top_k, 3);
  EXPECT_EQ(back.sampling.seed, 11u);
  EXPECT_EQ(back.sampling.top_p, 1.0f);
  EXPECT_EQ(back.route_hops, 3);
  EXPECT_TRUE(back.rewind);
  EXPECT_TRUE(back.verify);

  pb::StepRequest w = wire;
  w.set_has_expected_seq_len(false);  // rewind and verify are for decode steps
  ExpectThrowsKind([&] { DecodeStepRequest(w); }, ErrorKind::kInvalidArgument, "verify");
  w = wire;
  w.set_prefill(true);
  ExpectThrowsKind([&] { DecodeStepRequest(w); }, ErrorKind::kInvalidArgument, "verify");
  w = wire;
  w.set_session_id("not-hex");
  ExpectThrowsKind([&] { DecodeStepRequest(w); }, ErrorKind::kInvalidArgument, "session id");
  w = wire;
  w.set_session_secret("");
  ExpectThrowsKind([&] { DecodeStepRequest(w); }, ErrorKind::kInvalidArgument, "secret");
  w = wire;
  w.clear_bundle();
  ExpectThrowsKind([&] { DecodeStepRequest(w); }, ErrorKind::kInvalidArgument, "neither");
  w = wire;
  w.mutable_sampling()->set_temperature(-1);
  ExpectThrowsKind([&] { DecodeStepRequest(w); }, ErrorKind::kInvalidArgument, "temperature");
  w = wire;
  w.set_route_epoch(-1);
  ExpectThrowsKind([&] { DecodeStepRequest(w); }, ErrorKind::kInvalidArgument, "epoch");
  for (int hops : {-1, node::kMaxRouteHops + 1}) {
    w = wire;
    w.set_route_hops(hops);
    ExpectThrowsKind([&] { DecodeStepRequest(w); }, ErrorKind::kInvalidArgument, "route_hops");
  }
}

TEST(CodecTest, ResultsRoundTrip) {
  pb::StepResponse resp;
  shard::TailOutput t{42, {0.5f, -1.0f}, {7, 9, 42}};
  EncodeStepResult(t, 0, KvDtype::kF32, true, &resp);
  auto back = DecodeStepResponse(resp, 0);
  ASSERT_TRUE(std::holds_alternative<shard::TailOutput>(back));
  EXPECT_EQ(std::get<shard::TailOutput>(back).token_id, 42);
  EXPECT_EQ(std::get<shard::TailOutput>(back).logits, t.logits);
  EXPECT_EQ(std::get<shard::TailOutput>(back).row_tokens, t.row_tokens);

  resp.Clear();
  EncodeStepResult(t, 0, KvDtype::kF32, false, &resp);
  EXPECT_TRUE(std::get<shard::TailOutput>(DecodeStepResponse(resp, 0)).logits.empty());

  for (int i = 0; i < kv::kNumCacheMissReasons; ++i) {
    resp.Clear();
    kv::CacheMiss m{std::string(32, 'b'), 3, static_cast<kv::CacheMissReason>(i), "why"};
    EncodeStepResult(m, 3, KvDtype::kF32, false, &resp);
    auto got = std::get<kv::CacheMiss>(DecodeStepResponse(resp, 3));
    EXPECT_EQ(got.reason, m.reason);
    EXPECT_EQ(got.detail, "why");
    EXPECT_EQ(got.route_epoch, 3);
  }
  resp.Clear();
  EXPECT_THROW(DecodeStepResponse(resp, 0), Error);
}

TEST(StatusMapTest, EveryKindMapsBack) {
  for (ErrorKind k :
       {ErrorKind::kInvalidArgument, ErrorKind::kStaleEpoch, ErrorKind::kIncompatibleRecipe,
        ErrorKind::kBudgetExceeded, ErrorKind::kCacheMiss, ErrorKind::kSessionBusy,
        ErrorKind::kBoundaryContract, ErrorKind::kMalformedFile, ErrorKind::kUnavailable,
        ErrorKind::kPermissionDenied}) {
    const grpc::StatusCode code = StatusCodeFor(k);
    EXPECT_EQ(ErrorKindFor(code, ErrorKindName(k)), k) << ErrorKindName(k);
  }
  // Without the trailer, the code alone decides.
  EXPECT_EQ(StatusCodeFor(ErrorKind::kStaleEpoch), grpc::StatusCode::ABORTED);
  EXPECT_EQ(StatusCodeFor(ErrorKind::kIncompatibleRecipe), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(StatusCodeFor(ErrorKind::kBudgetExceeded), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ErrorKindFor(grpc::StatusCode::ABORTED, std::nullopt), ErrorKind::kStaleEpoch);
  EXPECT_EQ(ErrorKindFor(grpc::StatusCode::FAILED_PRECONDITION, std::nullopt),
            ErrorKind::kIncompatibleRecipe);
  EXPECT_EQ(ErrorKindFor(grpc::StatusCode::DEADLINE_EXCEEDED, std::nullopt),
            ErrorKind::kUnavailable);
  EXPECT_EQ(ErrorKindFor(grpc::StatusCode::UNAUTHENTICATED, std::nullopt),
            ErrorKind::kPermissionDenied);
  // A transport failure is a dead hop whatever a trailer claims.
  EXPECT_EQ(ErrorKindFor(grpc::StatusCode::UNAVAILABLE, "stale-epoch"), ErrorKind::kUnavailable);
}

}  // namespace
}  // namespace meshnet::rpc
