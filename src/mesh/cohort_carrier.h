// One thread carries the decode steps of many sessions through a route, hop
// after hop, as one group call per hop: the client side of
// `--pipeline-depth 1` (all sessions as one cohort through one node at a
// time, the setting for nodes that share a machine's cores).
//
//   mesh::CohortCarrier carrier(0.002);
//   // in each session's thread, for one decode step on `route`:
//   CohortCarrier::Carried c = carrier.Carry(route, request_for_hop_0);
//   // hops before c.hop answered bundles; c.result / c.error is hop c.hop's
//
// Why: without it, each hop's answer woke every session's thread, which
// decoded its bundle, built its next request and queued it for the next
// hop, where a leader waited for all of them before the next call: per hop
// 16 thread wake-ups and hand-offs on the client while every node idles (on
// three loopback nodes sharing 2 cores, ~0.9 ms per hop, a quarter of a
// 16-session round). The carrier's leader takes each hop's answers and sends
// them on itself; the sessions' threads wake once per token, at the end.
//
// Contract: Carry runs the step on hops 0, 1, ... for as long as each hop
// answers a boundary bundle, together with the other sessions' steps queued
// on the same route (the same endpoints in the same order); it returns at
// the first hop that answered anything else (the tail's output at the last
// hop, a cache miss, a "moved") or whose call failed (c.error holds what
// ShardEndpoint::Step would have thrown), with the request it sent there.
// The caller handles that hop's outcome as if it had made the call itself
// (mesh/route_step.cc), so one session's miss, error or redirect never
// touches the others. One cohort is carried at a time; steps that arrive
// meanwhile go in the next one. Before taking a cohort the leader waits for
// this process's sessions between two steps (util::Transit, at most
// `transit_wait_s`), and marks the sessions it answered at the tail as in
// transit.
//
// Thread-safety: Carry may be called from any number of threads; the
// route's endpoints must be safe for concurrent use (they are for concurrent
// sessions already).
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <optional>
#include <vector>

#include "mesh/generator.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace meshnet::mesh {

class CohortCarrier {
 public:
  explicit CohortCarrier(double transit_wait_s) : transit_wait_s_(transit_wait_s) {}
  CohortCarrier(const CohortCarrier&) = delete;
  CohortCarrier& operator=(const CohortCarrier&) = delete;

  struct Carried {
    size_t hop = 0;                    // the hop it stopped at
    StepRequest request;               // the request sent to that hop
    std::optional<StepResult> result;  // that hop's answer, or
    std::exception_ptr error;          // the error its call failed with
  };

  // `first` is the step's request for hop 0 (one token, no bundle).
  Carried Carry(const Route& route, StepRequest first);

  // Steps queued and not yet in a carried cohort (for tests).
  int64_t waiting() const EXCLUDES(mu_);

 private:
  struct Member;
  // Carries `cohort` through the route (the leader's thread, no lock held).
  static void Lead(const std::vector<Member*>& cohort);
  void TakeCohortLocked(std::vector<Member*>* cohort) REQUIRES(mu_);

  const double transit_wait_s_;
  mutable Mutex mu_;
  std::deque<Member*> queue_ GUARDED_BY(mu_);
  bool carrying_ GUARDED_BY(mu_) = false;
};

}  // namespace meshnet::mesh
