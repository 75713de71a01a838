// Test helper: a MeshNode that passes for a real node. It relays Info (with
// the cluster token it was given) and Prove (the real node's signed answer)
// to `real`, takes whatever else comes, and remembers every call and whether
// any call's metadata carried the token. What a drain must never send
// anything to (issue 32, HIGH 1 and 2). Listens on 127.0.0.1, port 0.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "proto/meshnet.grpc.pb.h"
#include "rpc/channel.h"
#include "util/mutex.h"

namespace meshnet::rpc::testing {

// A MeshNode that answers as `real` does (Info and Prove relayed to it) and
// takes whatever else comes, remembering every call and every token.
class FakeReplica final : public ::meshnet::v1::MeshNode::Service {
 public:
  // `token`: the cluster token the fake was given, to relay Info with.
  FakeReplica(const std::string& real, const std::string& token)
      : token_(token),
        stub_(::meshnet::v1::MeshNode::NewStub(MakeClientChannel(real, ClientOptions{}))) {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  ~FakeReplica() override { server_->Shutdown(); }
  const std::string& address() const { return address_; }

  grpc::Status Info(grpc::ServerContext* ctx, const ::meshnet::v1::InfoRequest* req,
                    ::meshnet::v1::InfoResponse* out) override {
    Note(*ctx, "Info");
    grpc::ClientContext c;
    c.AddMetadata("authorization", "Bearer " + token_);
    return stub_->Info(&c, *req, out);
  }
  grpc::Status Prove(grpc::ServerContext* ctx, const ::meshnet::v1::ProveRequest* req,
                     ::meshnet::v1::ProveResponse* out) override {
    Note(*ctx, "Prove");
    grpc::ClientContext c;
    return stub_->Prove(&c, *req, out);  // the real node's signed answer, relayed
  }
  grpc::Status OfferImport(grpc::ServerContext* ctx, const ::meshnet::v1::OfferImportRequest*,
                           ::meshnet::v1::OfferImportResponse*) override {
    Note(*ctx, "OfferImport");
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "fake");
  }
  grpc::Status ImportSession(grpc::ServerContext* ctx,
                             grpc::ServerReader<::meshnet::v1::SessionChunk>* r,
                             ::meshnet::v1::ImportSessionResponse*) override {
    Note(*ctx, "ImportSession");
    ::meshnet::v1::SessionChunk chunk;
    while (r->Read(&chunk)) {
      MutexLock lock(&mu_);
      ++chunks_;
    }
    return grpc::Status::OK;
  }

  std::vector<std::string> calls() const {
    MutexLock lock(&mu_);
    return calls_;
  }
  int64_t chunks() const {
    MutexLock lock(&mu_);
    return chunks_;
  }
  bool saw_token() const {
    MutexLock lock(&mu_);
    return saw_token_;
  }

 private:
  void Note(const grpc::ServerContext& ctx, const std::string& method) {
    MutexLock lock(&mu_);
    calls_.push_back(method);
    for (const auto& [k, v] : ctx.client_metadata()) {
      if (std::string(v.data(), v.size()).find(token_) != std::string::npos) saw_token_ = true;
    }
  }
  const std::string token_;
  std::unique_ptr<::meshnet::v1::MeshNode::Stub> stub_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  mutable Mutex mu_;
  std::vector<std::string> calls_ GUARDED_BY(mu_);
  int64_t chunks_ GUARDED_BY(mu_) = 0;
  bool saw_token_ GUARDED_BY(mu_) = false;
};

}  // namespace meshnet::rpc::testing
