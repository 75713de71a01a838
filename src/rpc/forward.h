// Chain forwarding on a node (StepRequest.chain_route, a client's
// --forwarding chain): after its layers, a node sends its bundle to the next
// hop of the client's route itself, and answers its caller with the route's
// answer (the tail's output, or the miss or failure of the hop that raised
// it, StepResponse.chain_hop).
//
// What keeps a node from being a relay to anywhere:
//   * a node forwards only along the route in the request, and only when it
//     is that route's hop chain_index itself (its own canonical address);
//     a step sent to a node the route does not name there is refused, so a
//     hop cannot hand the client's step to a node off the route;
//   * before the first step to a peer (and again after kProvenSeconds), the
//     peer must prove it is a meshnet node (a signature by its node key over
//     a fresh challenge and the address it is reached at) serving the same
//     model from the layer after this node's last, and, when this node has a
//     cluster token, a member of the cluster (rpc/prove.h). An address that
//     is not such a node gets no step, not even its first byte: Prove sends
//     no token and nothing of the client's. A failed proof is remembered for
//     kRefusedSeconds (no Prove storm at a bad address).
// The step then carries this node's cluster token (a peer is a member), the
// session's id, secret and epoch, the step id (a re-sent chain step is
// answered from each hop's idempotency cache), CRC and deadline as the
// client's own Step would.
//
// Internal to rpc/. Thread-safety: Forward and CheckChain are safe from any
// thread; no lock is held across a call.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "proto/meshnet.grpc.pb.h"
#include "rpc/options.h"
#include "rpc/prove.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace meshnet::rpc {

namespace pb = ::meshnet::v1;

class Forwarder {
 public:
  static constexpr int kMaxRouteHops = 16;
  static constexpr double kProvenSeconds = 60.0;
  // A peer that failed its proof is refused again without a new Prove (each
  // of which may hold a handler thread for the Info deadline) this long.
  static constexpr double kRefusedSeconds = 5.0;
  static constexpr size_t kMaxPeers = 64;

  struct Self {
    std::string model_id;
    int end_layer = 0;
  };

  // `peers`: how this node reaches others (its cluster token, TLS CA).
  Forwarder(ClientOptions peers, Self self);

  // Refuses (kInvalidArgument, kPermissionDenied) chain fields that are
  // malformed or do not name `own_address` (this node's canonical address;
  // empty: it cannot tell, so it takes no chain step) at chain_index.
  static void CheckChain(const pb::StepRequest& req, const std::string& own_address);

  // Sends `next` (this node's bundle as its input) to the hop after
  // next->chain_index and sets chain_index to that hop; fills `out` with the
  // route's answer. A failed or refused call becomes the answer's
  // chain_code (hop = the next hop), never this call's error. `deadline`:
  // the caller's (the downstream call gets no more).
  void Forward(std::chrono::system_clock::time_point deadline, pb::StepRequest* next,
               pb::StepResponse* out);

  int64_t forwarded() const { return forwarded_.load(std::memory_order_relaxed); }

 private:
  struct Peer;
  // The peer at `address`, proven within kProvenSeconds; throws
  // Error(kPermissionDenied) when it is not a node of the next layers, or
  // the error that kept it from answering.
  std::shared_ptr<Peer> ProvenPeer(const std::string& address);
  // Throws Error(kPermissionDenied) unless `proven` serves this model from
  // the layer after this node's last.
  void CheckPeer(const ProvenNode& proven, const std::string& address) const;

  const ClientOptions options_;
  const Self self_;
  const std::string bearer_;
  Mutex mu_;
  std::map<std::string, std::shared_ptr<Peer>> peers_ GUARDED_BY(mu_);
  std::atomic<int64_t> forwarded_{0};
};

}  // namespace meshnet::rpc
