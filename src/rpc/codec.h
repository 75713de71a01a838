// Conversions between meshnet values and the meshnet.v1 wire messages, with
// the wire-level validation of bundles. Internal to rpc/ (includes *.pb.h).
//
// Every Decode* validates before it returns and throws Error(kInvalidArgument)
// naming the problem; nothing is partially applied, so a caller that decodes
// first changes nothing on a malformed message.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "kv/cache_miss.h"
#include "node/step.h"
#include "proto/meshnet.pb.h"
#include "shard/boundary.h"
#include "util/dtype.h"

namespace meshnet::rpc {

namespace pb = ::meshnet::v1;

inline constexpr uint32_t kProtocolVersion = 1;
// gRPC's send/receive limit on both ends (bundles of long prompts are large).
inline constexpr int kMaxMessageBytes = 1 << 30;
// Steps in one StepMany call.
inline constexpr int kMaxStepsPerCall = 64;

pb::Dtype ToWireDtype(KvDtype t);
// A bundle's element type: DTYPE_F32/F16/BF16; kInvalidArgument for anything
// else (unspecified, unknown, or a KV-only quantized type).
KvDtype FromWireDtype(int wire);
// A session export's KV dtype: those and DTYPE_Q8_0/Q4_0.
KvDtype FromWireKvDtype(int wire);

// Encodes rows of `b` in `dtype` with a CRC32C of the payload. `route_epoch`
// goes into the bundle (the receiver checks it against its request).
void EncodeBundle(const shard::BoundaryBundle& b, int64_t route_epoch, KvDtype dtype,
                  pb::BoundaryBundle* out);
// Checks dtype, sizes (payload == n_tokens * n_embd * dtype size, positions ==
// n_tokens, n_tokens > 0, n_embd > 0), the checksum and that the epoch equals
// `expected_epoch`, then widens the payload to float32.
shard::BoundaryBundle DecodeBundle(const pb::BoundaryBundle& in, int64_t expected_epoch);

void EncodeSampling(const shard::SamplingContract& s, pb::SamplingContract* out);
shard::SamplingContract DecodeSampling(const pb::SamplingContract& in);  // validates

pb::CacheMissReason ToWireReason(kv::CacheMissReason r);
kv::CacheMissReason FromWireReason(int wire);
void EncodeCacheMiss(const kv::CacheMiss& m, pb::CacheMiss* out);
kv::CacheMiss DecodeCacheMiss(const pb::CacheMiss& in);

// Client side. `output_dtype` selects the dtype of the bundle the node answers.
void EncodeStepRequest(const node::StepRequest& r, KvDtype input_dtype, KvDtype output_dtype,
                       bool want_logits, pb::StepRequest* out);
// Client side: decodes the node's answer (bundle checksum verified).
node::StepResult DecodeStepResponse(const pb::StepResponse& in, int64_t route_epoch);

// Node side: the (validated) request as the in-process endpoint takes it.
node::StepRequest DecodeStepRequest(const pb::StepRequest& in);
void EncodeStepResult(const node::StepResult& r, int64_t route_epoch, KvDtype output_dtype,
                      bool want_logits, pb::StepResponse* out);

void EncodeInfo(const node::ShardInfo& info, pb::InfoResponse* out);
node::ShardInfo DecodeInfo(const pb::InfoResponse& in);
// The shard info plus what a serving node adds (protocol_version is set too).
void EncodeNodeInfo(const node::NodeInfo& info, pb::InfoResponse* out);
node::NodeInfo DecodeNodeInfo(const pb::InfoResponse& in);

}  // namespace meshnet::rpc
