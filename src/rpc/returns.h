// Chain forwarding's direct return, on the tail node (MeshNode.Returns).
//
// A client that sends its steps along a chain (StepRequest.chain_route)
// keeps one Returns stream open to the route's tail, under a random id it
// names in each step (StepRequest.return_id). The tail writes each answer on
// that stream as soon as it has it, so the token reaches the client over one
// link instead of travelling back through every hop: hops + 1 link crossings
// a step instead of 2 x hops. The answer still travels back along the chain
// as the head's reply, which the client uses when the stream has nothing
// (not open yet, broken, full): the stream only ever makes an answer early.
//
// Streams are gRPC callback reactors: an open stream pins no handler thread.
// At most `max_streams` are open at once; an id already open is refused.
// Each holds at most kMaxQueued answers not yet written (a client that
// stops reading loses the excess, and reads them from the head's replies).
//
// Internal to rpc/. Thread-safety: ReturnHub is safe from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "proto/meshnet.grpc.pb.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace meshnet::rpc {

namespace pb = ::meshnet::v1;

class ReturnHub {
 public:
  static constexpr size_t kMaxQueued = 64;
  static constexpr size_t kMinIdBytes = 16;
  static constexpr size_t kMaxIdBytes = 64;

  explicit ReturnHub(int max_streams) : max_streams_(max_streams) {}
  ReturnHub(const ReturnHub&) = delete;
  ReturnHub& operator=(const ReturnHub&) = delete;

  // The reactor of one Returns call: registered under `id` (answers the
  // stream's first, empty message), or finished at once with the reason it
  // was refused (bad id, id in use, too many streams). `authorized`: the
  // caller presented the cluster token.
  grpc::ServerWriteReactor<pb::StepReturn>* Open(grpc::CallbackServerContext* ctx,
                                                 const std::string& id, bool authorized);

  // Writes `answer` on the stream of `id`; false when there is none or its
  // queue is full (the answer then goes back along the chain only).
  bool Push(const std::string& id, const pb::StepReturn& answer);

  int open_streams() const;

 private:
  class Stream;
  void Remove(const std::string& id, const Stream* stream);

  const int max_streams_;
  mutable Mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Stream>> streams_ GUARDED_BY(mu_);
};

}  // namespace meshnet::rpc
