// The client's end of a tail's Returns stream (chain forwarding's direct
// return, rpc/returns.h): one per tail node, opened on a thread of its own
// that reads the tail's answers and hands each to the step that waits for
// it (by session id and step id). Answers nobody waits for are dropped.
//
// The stream only makes answers early: a step sent while the stream is not
// open (yet, or any more) names no return id, and its answer comes back
// along the chain as the head's reply.
//
// Internal to rpc/. Thread-safety: every method is safe from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "proto/meshnet.grpc.pb.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace meshnet::rpc {

namespace pb = ::meshnet::v1;

class ReturnListener {
 public:
  using Deliver = std::function<void(pb::StepResponse)>;

  // Opens the stream on `channel` (cluster token `bearer`, "" for none).
  ReturnListener(std::shared_ptr<grpc::Channel> channel, std::string bearer);
  // Cancels the stream and waits for its thread.
  ~ReturnListener();
  ReturnListener(const ReturnListener&) = delete;
  ReturnListener& operator=(const ReturnListener&) = delete;

  // The random id steps name (StepRequest.return_id).
  const std::string& id() const { return id_; }
  // The tail has the stream open (its first message came).
  bool ready() const;
  // The stream ended (the tail went away, refused it, or cancelled).
  bool ended() const;

  // `deliver` gets the answer of (session, step) if it comes on the stream
  // before Forget. Called on the stream's thread, with no lock held.
  void Expect(const std::string& session_id, uint64_t step_id, Deliver deliver);
  void Forget(const std::string& session_id, uint64_t step_id);

 private:
  void Read(std::shared_ptr<grpc::Channel> channel, std::string bearer);

  const std::string id_;
  mutable Mutex mu_;
  bool ready_ GUARDED_BY(mu_) = false;
  bool ended_ GUARDED_BY(mu_) = false;
  grpc::ClientContext* ctx_ GUARDED_BY(mu_) = nullptr;  // the call's, while it runs
  bool cancelled_ GUARDED_BY(mu_) = false;
  std::map<std::pair<std::string, uint64_t>, Deliver> waiting_ GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace meshnet::rpc
