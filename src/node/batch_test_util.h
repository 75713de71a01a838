// Test helpers shared by the node/ batching tests: step requests, and a
// runner that queues steps from one thread each while the batcher is held,
// so that they form one batch when it resumes (no sleeps).
#pragma once

#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "node/node.h"

namespace meshnet::node {

inline StepRequest Prefill(const std::string& id, std::vector<int32_t> tokens) {
  StepRequest r;
  r.session_id = id;
  r.session_secret = "s";
  r.prefill = true;
  r.token_ids = std::move(tokens);
  return r;
}

inline StepRequest Decode(const std::string& id, int32_t token, int64_t seq_len) {
  StepRequest r = Prefill(id, {token});
  r.prefill = false;
  r.expected_seq_len = seq_len;
  return r;
}

// Runs `requests` on `node` from one thread each, queued in order while the
// batcher is held, then released together.
inline std::vector<StepResult> RunHeld(Node& node, std::vector<StepRequest> requests) {
  std::vector<StepResult> out(requests.size());
  std::vector<std::thread> threads;
  node.batcher().Hold();
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = node.Step(requests[i]); });
    node.batcher().WaitPending(static_cast<int64_t>(i) + 1);  // queued in this order
  }
  node.batcher().Resume();
  for (auto& t : threads) t.join();
  return out;
}

inline const shard::TailOutput& Tail(const StepResult& r) { return std::get<shard::TailOutput>(r); }

}  // namespace meshnet::node
