// One hop of a route: a shard that can run steps for sessions. Implemented
// in-process (mesh/in_process.h, wrapping a node::Node) and over gRPC
// (rpc/, a remote node). The generation loop (mesh/generator.h) only sees this
// interface, so failover and miss recovery are the same code for both.
//
// Thread-safety: implementations are safe to call from several threads for
// different sessions.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "node/step.h"

namespace meshnet::mesh {

// The node's vocabulary (node/step.h), as the client sees it.
using ShardInfo = node::ShardInfo;
using StepRequest = node::StepRequest;
using StepResult = node::StepResult;

// One step's answer in a group call: its result, or what Step would have
// thrown for it.
struct GroupAnswer {
  std::optional<StepResult> result;
  std::exception_ptr error;
};

// A chain step's answer (ShardEndpoint::ChainStep): hop `hop` of the route
// answered `result` (the tail's output, a miss; a bundle from a hop that did
// not forward it) or failed with `error`.
struct ChainAnswer {
  std::optional<StepResult> result;
  std::exception_ptr error;
  size_t hop = 0;
  int64_t route_compute_micros = 0;  // every hop's compute time, as the hops said
};

class ShardEndpoint;
using RouteHops = std::span<const std::shared_ptr<ShardEndpoint>>;

class ShardEndpoint {
 public:
  virtual ~ShardEndpoint() = default;
  // For logs and errors: "in-process[0-1]" or "127.0.0.1:7001".
  virtual std::string name() const = 0;
  // Throws Error(kUnavailable) if the node cannot be reached.
  virtual ShardInfo Info() = 0;
  // Runs one step. A CacheMiss is a value. Throws Error(kUnavailable) for a dead
  // or timed-out node, and other typed Errors for protocol violations.
  virtual StepResult Step(StepRequest request) = 0;
  // Runs decode steps of distinct sessions together where the endpoint can
  // (a node's StepMany: one call, one batch); the answers are parallel to
  // the requests, and one step's error never fails another. Default: Step
  // for each, in order.
  virtual std::vector<GroupAnswer> StepGroup(std::span<const StepRequest> requests) {
    std::vector<GroupAnswer> answers(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      try {
        answers[i].result = Step(requests[i]);
      } catch (...) {
        answers[i].error = std::current_exception();
      }
    }
    return answers;
  }
  // Chain forwarding: sends `request` to this hop (`route`'s head), which
  // sends its bundle on along `route` itself; the answer is the route's.
  // nullopt: this endpoint does not chain (in process, or told not to): the
  // caller goes hop by hop. Errors of the call come back in the answer.
  virtual std::optional<ChainAnswer> ChainStep(StepRequest request, RouteHops route) {
    (void)request, (void)route;
    return std::nullopt;
  }
  // Frees the session's state on this hop; best effort (never throws).
  virtual void Release(const std::string& session_id, const std::string& session_secret,
                       int64_t route_epoch) = 0;
  // Keeps the first min(length, held) positions of the session on this hop
  // and returns how many it holds now. A session the hop no longer holds
  // throws kv::CacheMissError; an endpoint that cannot truncate throws
  // Error(kUnavailable) (its caller re-prefills instead).
  virtual int64_t Truncate(const std::string& session_id, const std::string& session_secret,
                           int64_t route_epoch, int64_t length);
  // The session is kept for a later request (a prefix cache): the hop may
  // treat it as idle until its next step. Best effort (never throws);
  // default: nothing.
  virtual void Park(const std::string& session_id, const std::string& session_secret,
                    int64_t route_epoch) {
    (void)session_id, (void)session_secret, (void)route_epoch;
  }
};

}  // namespace meshnet::mesh
