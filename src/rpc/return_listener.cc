#include "rpc/return_listener.h"

#include <grpcpp/grpcpp.h>

#include "rpc/client_log.h"
#include "util/secret.h"

namespace meshnet::rpc {

ReturnListener::ReturnListener(std::shared_ptr<grpc::Channel> channel, std::string bearer)
    : id_(RandomBytes16()) {
  thread_ = std::thread(
      [this, channel = std::move(channel), bearer = std::move(bearer)] { Read(channel, bearer); });
}

ReturnListener::~ReturnListener() {
  {
    MutexLock lock(&mu_);
    cancelled_ = true;
    if (ctx_ != nullptr) ctx_->TryCancel();
  }
  thread_.join();
}

bool ReturnListener::ready() const {
  MutexLock lock(&mu_);
  return ready_ && !ended_;
}

bool ReturnListener::ended() const {
  MutexLock lock(&mu_);
  return ended_;
}

void ReturnListener::Expect(const std::string& session_id, uint64_t step_id, Deliver deliver) {
  MutexLock lock(&mu_);
  waiting_[{session_id, step_id}] = std::move(deliver);
}

void ReturnListener::Forget(const std::string& session_id, uint64_t step_id) {
  Deliver gone;  // destroyed outside the lock
  MutexLock lock(&mu_);
  auto it = waiting_.find({session_id, step_id});
  if (it == waiting_.end()) return;
  gone = std::move(it->second);
  waiting_.erase(it);
}

void ReturnListener::Read(std::shared_ptr<grpc::Channel> channel, std::string bearer) {
  grpc::ClientContext ctx;
  if (!bearer.empty()) ctx.AddMetadata("authorization", bearer);
  {
    MutexLock lock(&mu_);
    if (cancelled_) {
      ended_ = true;
      return;
    }
    ctx_ = &ctx;
  }
  auto stub = pb::MeshNode::NewStub(channel);
  pb::ReturnsRequest req;
  req.set_return_id(id_);
  std::unique_ptr<grpc::ClientReader<pb::StepReturn>> reader = stub->Returns(&ctx, req);
  pb::StepReturn msg;
  while (reader->Read(&msg)) {
    if (msg.session_id().empty()) {
      MutexLock lock(&mu_);
      ready_ = true;
      continue;
    }
    Deliver deliver;
    {
      MutexLock lock(&mu_);
      auto it = waiting_.find({msg.session_id(), msg.step_id()});
      if (it == waiting_.end()) continue;  // its step took the head's reply
      deliver = std::move(it->second);
      waiting_.erase(it);
    }
    deliver(std::move(*msg.mutable_response()));
  }
  const grpc::Status s = reader->Finish();
  MutexLock lock(&mu_);
  ended_ = true;
  ctx_ = nullptr;
  if (!cancelled_) {
    ClientLog().debug("event=returns_stream_ended code={} message=\"{}\"",
                      static_cast<int>(s.error_code()), s.error_message());
  }
}

}  // namespace meshnet::rpc
