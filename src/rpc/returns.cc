#include "rpc/returns.h"

#include <deque>
#include <utility>

namespace meshnet::rpc {

// One open Returns call. Owned by shared pointers: the hub's (while it is
// registered), Push's (while it writes) and its own (`self_`, until gRPC's
// OnDone), so a Push racing the stream's end never touches a freed reactor.
//
// A write in flight holds off Finish: Finish is called once, by whoever sees
// the stream cancelled (or a write fail) with no write in flight, so no
// StartWrite ever follows it.
class ReturnHub::Stream final : public grpc::ServerWriteReactor<pb::StepReturn> {
 public:
  Stream(ReturnHub* hub, std::string id) : hub_(hub), id_(std::move(id)) {}

  void Start(std::shared_ptr<Stream> self) {
    self_ = std::move(self);
    Push(pb::StepReturn());  // the first, empty message: the stream is open
  }

  bool Push(const pb::StepReturn& answer) {
    {
      MutexLock lock(&mu_);
      if (cancelled_ || finished_ || queue_.size() >= kMaxQueued) return false;
      queue_.push_back(answer);
      if (writing_) return true;
      writing_ = true;
      in_flight_ = std::move(queue_.front());
      queue_.pop_front();
    }
    StartWrite(&in_flight_);
    return true;
  }

  void OnWriteDone(bool ok) override {
    enum { kNothing, kWrite, kFinish } next = kNothing;
    {
      MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) cancelled_ = true;
      if (cancelled_) {
        if (!finished_) {
          finished_ = true;
          next = kFinish;
        }
      } else if (!queue_.empty()) {
        writing_ = true;
        in_flight_ = std::move(queue_.front());
        queue_.pop_front();
        next = kWrite;
      }
    }
    if (next == kWrite) StartWrite(&in_flight_);
    if (next == kFinish)
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the Returns stream ended"));
  }

  void OnCancel() override {
    {
      MutexLock lock(&mu_);
      cancelled_ = true;
      if (writing_ || finished_) return;
      finished_ = true;
    }
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the Returns stream was cancelled"));
  }

  void OnDone() override {
    hub_->Remove(id_, this);
    std::shared_ptr<Stream> last = std::move(self_);  // may free this on return
  }

 private:
  ReturnHub* const hub_;
  const std::string id_;
  std::shared_ptr<Stream> self_;
  Mutex mu_;
  std::deque<pb::StepReturn> queue_ GUARDED_BY(mu_);
  bool writing_ GUARDED_BY(mu_) = false;
  bool cancelled_ GUARDED_BY(mu_) = false;
  bool finished_ GUARDED_BY(mu_) = false;
  pb::StepReturn in_flight_;  // the message of the write in flight (writing_)
};

namespace {

// A reactor that finishes at once with `status`.
class Refused final : public grpc::ServerWriteReactor<pb::StepReturn> {
 public:
  explicit Refused(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<pb::StepReturn>* ReturnHub::Open(grpc::CallbackServerContext* ctx,
                                                          const std::string& id, bool authorized) {
  (void)ctx;
  if (!authorized) {
    return new Refused(
        grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong cluster token"));
  }
  if (id.size() < kMinIdBytes || id.size() > kMaxIdBytes) {
    return new Refused(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                    "a return id holds " + std::to_string(kMinIdBytes) + ".." +
                                        std::to_string(kMaxIdBytes) + " bytes"));
  }
  auto stream = std::make_shared<Stream>(this, id);
  {
    MutexLock lock(&mu_);
    if (streams_.count(id) != 0) {
      return new Refused(grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                                      "a Returns stream of this id is open already"));
    }
    if (static_cast<int>(streams_.size()) >= max_streams_) {
      return new Refused(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                      "too many open Returns streams (limit " +
                                          std::to_string(max_streams_) +
                                          "): chain steps still answer through the head"));
    }
    streams_.emplace(id, stream);
  }
  Stream* reactor = stream.get();
  reactor->Start(std::move(stream));
  return reactor;
}

bool ReturnHub::Push(const std::string& id, const pb::StepReturn& answer) {
  std::shared_ptr<Stream> stream;
  {
    MutexLock lock(&mu_);
    auto it = streams_.find(id);
    if (it == streams_.end()) return false;
    stream = it->second;
  }
  return stream->Push(answer);
}

void ReturnHub::Remove(const std::string& id, const Stream* stream) {
  std::shared_ptr<Stream> removed;  // freed outside the lock
  MutexLock lock(&mu_);
  auto it = streams_.find(id);
  if (it != streams_.end() && it->second.get() == stream) {
    removed = std::move(it->second);
    streams_.erase(it);
  }
}

int ReturnHub::open_streams() const {
  MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

}  // namespace meshnet::rpc
