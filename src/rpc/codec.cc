#include "rpc/codec.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "node/identity.h"
#include "util/crc32c.h"
#include "util/error.h"

namespace meshnet::rpc {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian; add byte swapping for this host");

namespace {

constexpr int64_t kMaxBundleBytes = int64_t{1} << 31;  // 2 GiB: above gRPC's message limit

std::string Str(int64_t v) { return std::to_string(v); }

// float32 rows -> the wire dtype's bytes.
void NarrowRows(const std::vector<float>& rows, KvDtype dtype, std::string* out) {
  const size_t n = rows.size();
  out->resize(n * KvDtypeSize(dtype));
  char* p = out->data();
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(p, rows.data(), n * sizeof(float));
      break;
    case KvDtype::kF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = FloatToHalf(rows[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      break;
    case KvDtype::kBF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = FloatToBf16(rows[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      break;
    case KvDtype::kQ8_0:  // KV only: never a bundle's dtype (FromWireDtype)
    case KvDtype::kQ4_0:
      ThrowInvalidArgument("a bundle cannot be sent in a quantized KV dtype");
  }
}

// `elems` values of the wire dtype at `p` -> float32 rows.
void WidenRows(const char* p, int64_t elems, KvDtype dtype, std::vector<float>* out) {
  out->resize(elems);
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(out->data(), p, elems * sizeof(float));
      break;
    case KvDtype::kF16:
      for (int64_t i = 0; i < elems; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        (*out)[i] = HalfToFloat(h);
      }
      break;
    case KvDtype::kBF16:
      for (int64_t i = 0; i < elems; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        (*out)[i] = Bf16ToFloat(h);
      }
      break;
    case KvDtype::kQ8_0:  // refused by FromWireDtype before
    case KvDtype::kQ4_0:
      ThrowInvalidArgument("a bundle cannot be in a quantized KV dtype");
  }
}

}  // namespace

pb::Dtype ToWireDtype(KvDtype t) {
  switch (t) {
    case KvDtype::kF32:
      return pb::DTYPE_F32;
    case KvDtype::kF16:
      return pb::DTYPE_F16;
    case KvDtype::kBF16:
      return pb::DTYPE_BF16;
    case KvDtype::kQ8_0:
      return pb::DTYPE_Q8_0;
    case KvDtype::kQ4_0:
      return pb::DTYPE_Q4_0;
  }
  return pb::DTYPE_UNSPECIFIED;
}

KvDtype FromWireDtype(int wire) {
  switch (wire) {
    case pb::DTYPE_F32:
      return KvDtype::kF32;
    case pb::DTYPE_F16:
      return KvDtype::kF16;
    case pb::DTYPE_BF16:
      return KvDtype::kBF16;
    default:
      break;
  }
  ThrowInvalidArgument("bundle dtype " + std::to_string(wire) +
                       " is not one of DTYPE_F32, DTYPE_F16, DTYPE_BF16");
}

KvDtype FromWireKvDtype(int wire) {
  if (wire == pb::DTYPE_Q8_0) return KvDtype::kQ8_0;
  if (wire == pb::DTYPE_Q4_0) return KvDtype::kQ4_0;
  return FromWireDtype(wire);
}

void EncodeBundle(const shard::BoundaryBundle& b, int64_t route_epoch, KvDtype dtype,
                  pb::BoundaryBundle* out) {
  out->set_architecture(b.architecture_adapter);
  out->set_schema_version(static_cast<uint32_t>(b.schema_version));
  out->set_tensor_name(b.tensor_name);
  out->set_n_tokens(b.n_tokens);
  out->set_n_embd(b.n_embd);
  out->set_dtype(ToWireDtype(dtype));
  std::string* payload = out->mutable_payload();
  NarrowRows(b.residual, dtype, payload);
  out->mutable_positions()->Assign(b.positions.begin(), b.positions.end());
  out->set_next_layer(b.next_layer);
  out->set_normalized(b.normalized);
  out->set_route_epoch(route_epoch);
  out->set_crc32c(Crc32c(payload->data(), payload->size()));
}

shard::BoundaryBundle DecodeBundle(const pb::BoundaryBundle& in, int64_t expected_epoch) {
  const KvDtype dtype = FromWireDtype(in.dtype());
  if (in.n_tokens() <= 0 || in.n_embd() <= 0) {
    ThrowInvalidArgument("bundle shape (" + Str(in.n_tokens()) + ", " + Str(in.n_embd()) +
                         ") must be positive");
  }
  if (in.n_embd() > kMaxBundleBytes || in.n_tokens() > kMaxBundleBytes / in.n_embd()) {
    ThrowInvalidArgument("bundle shape (" + Str(in.n_tokens()) + ", " + Str(in.n_embd()) +
                         ") is too large");
  }
  const int64_t elems = in.n_tokens() * in.n_embd();
  const int64_t want_bytes = elems * KvDtypeSize(dtype);
  if (static_cast<int64_t>(in.payload().size()) != want_bytes) {
    ThrowInvalidArgument("bundle payload holds " + Str(in.payload().size()) + " bytes but shape (" +
                         Str(in.n_tokens()) + ", " + Str(in.n_embd()) + ") of " +
                         std::string(KvDtypeName(dtype)) + " needs " + Str(want_bytes));
  }
  if (in.positions_size() != in.n_tokens()) {
    ThrowInvalidArgument("bundle carries " + Str(in.positions_size()) + " positions for " +
                         Str(in.n_tokens()) + " tokens");
  }
  const uint32_t crc = Crc32c(in.payload().data(), in.payload().size());
  if (crc != in.crc32c()) {
    ThrowInvalidArgument("bundle payload checksum mismatch (crc32c " + std::to_string(crc) +
                         ", message says " + std::to_string(in.crc32c()) + ")");
  }
  if (in.route_epoch() != expected_epoch) {
    ThrowInvalidArgument("bundle was made for route epoch " + Str(in.route_epoch()) +
                         " but the request is at epoch " + Str(expected_epoch));
  }
  shard::BoundaryBundle b;
  b.architecture_adapter = in.architecture();
  b.schema_version = static_cast<int>(in.schema_version());
  b.tensor_name = in.tensor_name();
  b.n_tokens = in.n_tokens();
  b.n_embd = in.n_embd();
  b.next_layer = in.next_layer();
  b.normalized = in.normalized();
  b.positions.assign(in.positions().begin(), in.positions().end());
  WidenRows(in.payload().data(), elems, dtype, &b.residual);
  return b;
}

void EncodeSampling(const shard::SamplingContract& s, pb::SamplingContract* out) {
  out->set_temperature(s.temperature);
  out->set_top_k(s.top_k);
  out->set_top_p(s.top_p);
  out->set_seed(s.seed);
}

shard::SamplingContract DecodeSampling(const pb::SamplingContract& in) {
  shard::SamplingContract s;
  s.temperature = in.temperature();
  s.top_k = in.top_k();
  s.top_p = in.top_p() == 0.0f ? 1.0f : in.top_p();
  s.seed = in.seed();
  s.Validate();
  return s;
}

pb::CacheMissReason ToWireReason(kv::CacheMissReason r) {
  switch (r) {
    case kv::CacheMissReason::kUnknownSession:
      return pb::CACHE_MISS_UNKNOWN_SESSION;
    case kv::CacheMissReason::kEvictedTtl:
      return pb::CACHE_MISS_EVICTED_TTL;
    case kv::CacheMissReason::kEvictedLru:
      return pb::CACHE_MISS_EVICTED_LRU;
    case kv::CacheMissReason::kReleased:
      return pb::CACHE_MISS_RELEASED;
    case kv::CacheMissReason::kSupersededEpoch:
      return pb::CACHE_MISS_SUPERSEDED_EPOCH;
    case kv::CacheMissReason::kSeqLenMismatch:
      return pb::CACHE_MISS_SEQ_LEN_MISMATCH;
    case kv::CacheMissReason::kMoved:
      return pb::CACHE_MISS_MOVED;
    case kv::CacheMissReason::kPreempted:
      return pb::CACHE_MISS_PREEMPTED;
  }
  return pb::CACHE_MISS_REASON_UNSPECIFIED;
}

kv::CacheMissReason FromWireReason(int wire) {
  switch (wire) {
    case pb::CACHE_MISS_UNKNOWN_SESSION:
      return kv::CacheMissReason::kUnknownSession;
    case pb::CACHE_MISS_EVICTED_TTL:
      return kv::CacheMissReason::kEvictedTtl;
    case pb::CACHE_MISS_EVICTED_LRU:
      return kv::CacheMissReason::kEvictedLru;
    case pb::CACHE_MISS_RELEASED:
      return kv::CacheMissReason::kReleased;
    case pb::CACHE_MISS_SUPERSEDED_EPOCH:
      return kv::CacheMissReason::kSupersededEpoch;
    case pb::CACHE_MISS_SEQ_LEN_MISMATCH:
      return kv::CacheMissReason::kSeqLenMismatch;
    case pb::CACHE_MISS_MOVED:
      return kv::CacheMissReason::kMoved;
    case pb::CACHE_MISS_PREEMPTED:
      return kv::CacheMissReason::kPreempted;
    default:
      break;
  }
  // A reason from a newer node: the safe reading of any miss is "state gone".
  return kv::CacheMissReason::kUnknownSession;
}

void EncodeCacheMiss(const kv::CacheMiss& m, pb::CacheMiss* out) {
  out->set_session_id(m.session_id);
  out->set_route_epoch(m.route_epoch);
  out->set_reason(ToWireReason(m.reason));
  out->set_detail(m.detail);
  out->set_moved_to(m.moved_to);
}

kv::CacheMiss DecodeCacheMiss(const pb::CacheMiss& in) {
  kv::CacheMiss m;
  m.session_id = in.session_id();
  m.route_epoch = in.route_epoch();
  m.reason = FromWireReason(in.reason());
  m.detail = in.detail();
  m.moved_to = in.moved_to();
  return m;
}

void EncodeStepRequest(const node::StepRequest& r, KvDtype input_dtype, KvDtype output_dtype,
                       bool want_logits, pb::StepRequest* out) {
  out->set_session_id(r.session_id);
  out->set_session_secret(r.session_secret);
  out->set_route_epoch(r.route_epoch);
  out->set_step_id(r.step_id);
  out->set_prefill(r.prefill);
  out->set_has_expected_seq_len(r.expected_seq_len.has_value());
  out->set_expected_seq_len(r.expected_seq_len.value_or(0));
  if (r.bundle) {
    EncodeBundle(*r.bundle, r.route_epoch, input_dtype, out->mutable_bundle());
  } else {
    out->mutable_tokens()->mutable_ids()->Assign(r.token_ids.begin(), r.token_ids.end());
  }
  EncodeSampling(r.sampling, out->mutable_sampling());
  out->set_output_dtype(ToWireDtype(output_dtype));
  out->set_omit_logits(!want_logits);
  out->set_route_hops(r.route_hops);
  out->set_rewind(r.rewind);
  out->set_verify(r.verify);
}

node::StepResult DecodeStepResponse(const pb::StepResponse& in, int64_t route_epoch) {
  switch (in.result_case()) {
    case pb::StepResponse::kBundle:
      return DecodeBundle(in.bundle(), route_epoch);
    case pb::StepResponse::kTail: {
      shard::TailOutput t;
      t.token_id = in.tail().token_id();
      t.logits.assign(in.tail().logits().begin(), in.tail().logits().end());
      t.row_tokens.assign(in.tail().row_tokens().begin(), in.tail().row_tokens().end());
      return t;
    }
    case pb::StepResponse::kMiss:
      return DecodeCacheMiss(in.miss());
    default:
      break;
  }
  ThrowInvalidArgument("step response carries no result");
}

node::StepRequest DecodeStepRequest(const pb::StepRequest& in) {
  node::StepRequest r;
  node::ValidateSessionKey(in.session_id(), in.session_secret(), in.route_epoch());
  r.session_id = in.session_id();
  r.session_secret = in.session_secret();
  r.route_epoch = in.route_epoch();
  r.step_id = in.step_id();
  r.prefill = in.prefill();
  if (in.route_hops() < 0 || in.route_hops() > node::kMaxRouteHops) {
    ThrowInvalidArgument("route_hops must be in 0.." + std::to_string(node::kMaxRouteHops));
  }
  r.route_hops = in.route_hops();
  if (in.has_expected_seq_len()) {
    if (in.expected_seq_len() < 0) ThrowInvalidArgument("expected_seq_len must be >= 0");
    r.expected_seq_len = in.expected_seq_len();
  }
  switch (in.input_case()) {
    case pb::StepRequest::kTokens:
      if (in.tokens().ids_size() == 0) ThrowInvalidArgument("step carries no token ids");
      r.token_ids.assign(in.tokens().ids().begin(), in.tokens().ids().end());
      break;
    case pb::StepRequest::kBundle:
      r.bundle = DecodeBundle(in.bundle(), in.route_epoch());
      break;
    default:
      ThrowInvalidArgument("step carries neither token ids nor a boundary bundle");
  }
  if (in.output_dtype() != pb::DTYPE_UNSPECIFIED) FromWireDtype(in.output_dtype());
  r.sampling = DecodeSampling(in.sampling());
  r.rewind = in.rewind();
  r.verify = in.verify();
  if ((r.rewind || r.verify) && (r.prefill || !r.expected_seq_len)) {
    ThrowInvalidArgument("rewind and verify need a decode step with expected_seq_len");
  }
  return r;
}

void EncodeStepResult(const node::StepResult& r, int64_t route_epoch, KvDtype output_dtype,
                      bool want_logits, pb::StepResponse* out) {
  if (const auto* b = std::get_if<shard::BoundaryBundle>(&r)) {
    EncodeBundle(*b, route_epoch, output_dtype, out->mutable_bundle());
  } else if (const auto* t = std::get_if<shard::TailOutput>(&r)) {
    pb::TailOutput* tail = out->mutable_tail();
    tail->set_token_id(t->token_id);
    tail->mutable_row_tokens()->Assign(t->row_tokens.begin(), t->row_tokens.end());
    if (want_logits) tail->mutable_logits()->Assign(t->logits.begin(), t->logits.end());
  } else {
    EncodeCacheMiss(std::get<kv::CacheMiss>(r), out->mutable_miss());
  }
}

void EncodeInfo(const node::ShardInfo& info, pb::InfoResponse* out) {
  out->set_model_id(info.model_id);
  out->set_architecture(info.architecture);
  out->set_start_layer(info.start_layer);
  out->set_end_layer(info.end_layer);
  out->set_total_layers(info.total_layers);
  out->set_recipe_fingerprint(info.recipe_fingerprint);
  out->set_kv_budget_bytes(info.kv_budget_bytes);
  out->set_kv_bytes_free(info.kv_bytes_free);
  out->set_kv_tokens_free(info.kv_tokens_free);
  out->set_live_sessions(info.live_sessions);
  out->set_version(info.version);
  out->set_protocol_version(kProtocolVersion);
}

node::ShardInfo DecodeInfo(const pb::InfoResponse& in) {
  node::ShardInfo info;
  info.model_id = in.model_id();
  info.architecture = in.architecture();
  info.start_layer = in.start_layer();
  info.end_layer = in.end_layer();
  info.total_layers = in.total_layers();
  info.recipe_fingerprint = in.recipe_fingerprint();
  info.kv_budget_bytes = in.kv_budget_bytes();
  info.kv_bytes_free = in.kv_bytes_free();
  info.kv_tokens_free = in.kv_tokens_free();
  info.live_sessions = in.live_sessions();
  info.version = in.version();
  return info;
}

void EncodeNodeInfo(const node::NodeInfo& info, pb::InfoResponse* out) {
  EncodeInfo(info.shard, out);
  out->set_instance_id(info.instance_id);
  out->set_kv_bytes_reserved(info.kv_bytes_reserved);
  out->set_kv_bytes_reserved_peak(info.kv_bytes_reserved_peak);
  out->set_steps_served(info.steps_served);
  out->set_n_embd(info.n_embd);
  out->set_vocab_size(info.vocab_size);
}

node::NodeInfo DecodeNodeInfo(const pb::InfoResponse& in) {
  node::NodeInfo info;
  info.shard = DecodeInfo(in);
  info.instance_id = in.instance_id();
  info.kv_bytes_reserved = in.kv_bytes_reserved();
  info.kv_bytes_reserved_peak = in.kv_bytes_reserved_peak();
  info.steps_served = in.steps_served();
  info.n_embd = in.n_embd();
  info.vocab_size = in.vocab_size();
  return info;
}

}  // namespace meshnet::rpc
