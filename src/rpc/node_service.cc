#include "rpc/node_service.h"

#include <utility>

#include "rpc/drain.h"
#include "rpc/migrate.h"
#include "util/error.h"

namespace meshnet::rpc {

NodeService::NodeService(node::Node* node, node::NodeCoreOptions options) : core_(node, options) {}

void NodeService::Info(pb::InfoResponse* out) { EncodeNodeInfo(core_.Info(), out); }

namespace {

void EncodeReply(const node::StepReply& reply, int64_t route_epoch, const node::ReplyFormat& format,
                 pb::StepResponse* response) {
  EncodeStepResult(reply.result, route_epoch, format.bundle_dtype, format.want_logits, response);
  response->set_compute_micros(reply.compute_micros);
  response->set_replayed(reply.replayed);
}

}  // namespace

void NodeService::Decode(const pb::StepRequest& request, node::StepRequest* r,
                         node::ReplyFormat* format) {
  try {
    *r = DecodeStepRequest(request);
    if (request.output_dtype() != pb::DTYPE_UNSPECIFIED) {
      format->bundle_dtype = FromWireDtype(request.output_dtype());
    }
    format->want_logits = !request.omit_logits();
  } catch (const Error& e) {
    core_.counters().CountError(e.kind());
    throw;
  }
}

void NodeService::Step(const pb::StepRequest& request, pb::StepResponse* response) {
  node::StepRequest r;
  node::ReplyFormat format;
  Decode(request, &r, &format);
  EncodeReply(core_.Step(std::move(r), format), request.route_epoch(), format, response);
}

void NodeService::StepMany(const pb::StepManyRequest& request, std::span<const int> which,
                           pb::StepManyResponse* out, std::span<std::exception_ptr> errors) {
  std::vector<node::StepRequest> rs;
  std::vector<node::ReplyFormat> formats;
  std::vector<int> at;  // rs[k] is step at[k]
  for (const int i : which) {
    node::StepRequest r;
    node::ReplyFormat format;
    try {
      Decode(request.steps(i), &r, &format);
    } catch (...) {
      errors[i] = std::current_exception();
      continue;
    }
    rs.push_back(std::move(r));
    formats.push_back(format);
    at.push_back(i);
  }
  std::vector<std::optional<node::StepReply>> replies(rs.size());
  std::vector<std::exception_ptr> failed(rs.size());
  core_.StepMany(rs, formats, replies, failed);
  for (size_t k = 0; k < rs.size(); ++k) {
    const int i = at[k];
    if (failed[k]) {
      errors[i] = failed[k];
      continue;
    }
    try {
      EncodeReply(*replies[k], request.steps(i).route_epoch(), formats[k],
                  out->mutable_outcomes(i)->mutable_response());
    } catch (...) {
      errors[i] = std::current_exception();
    }
  }
}

void NodeService::Truncate(const pb::TruncateRequest& request, pb::TruncateResponse* response) {
  const node::TruncateReply reply = core_.Truncate(request.session_id(), request.session_secret(),
                                                   request.route_epoch(), request.length());
  if (const auto* len = std::get_if<int64_t>(&reply)) {
    response->set_seq_len(*len);
  } else {
    EncodeCacheMiss(std::get<kv::CacheMiss>(reply), response->mutable_miss());
  }
}

void NodeService::Release(const pb::ReleaseRequest& request, pb::ReleaseResponse* response) {
  response->set_released(
      request.park()
          ? core_.Park(request.session_id(), request.session_secret(), request.route_epoch())
          : core_.Release(request.session_id(), request.session_secret(), request.route_epoch()));
}

void NodeService::ExportSession(const pb::ExportSessionRequest& request,
                                const std::function<bool(const pb::SessionChunk&)>& write) {
  ServeExport(core_, request, write);
}

void NodeService::ImportSession(const std::function<bool(pb::SessionChunk*)>& read,
                                pb::ImportSessionResponse* response) {
  ServeImport(core_, read, response);
}

void NodeService::set_drain_hooks(ReplicaFinder finder, std::function<void(bool)> on_drain) {
  MutexLock lock(&hooks_mu_);
  default_finder_ = std::move(finder);
  on_drain_ = std::move(on_drain);
}

void NodeService::Drain(const pb::DrainRequest& request, pb::DrainResponse* response) {
  DrainOptions o;
  std::function<void(bool)> on_drain;
  {
    MutexLock lock(&hooks_mu_);
    o.find_replicas = default_finder_;
    on_drain = on_drain_;
  }
  if (!request.targets().empty()) {
    o.find_replicas = StaticReplicas(
        std::vector<std::string>(request.targets().begin(), request.targets().end()));
  }
  if (on_drain) on_drain(true);
  o.client = peers_;
  o.deadline_s = peers_.timeout_s;
  const DrainReport r = DrainSessions(core_, o);
  response->set_sessions(r.sessions);
  response->set_moved(r.moved);
  response->set_ended(r.ended);
  response->set_bytes_moved(r.bytes_moved);
  response->set_seconds(r.seconds);
  for (const auto& n : r.notes) response->add_notes(n);
}

bool NodeService::Undrain() {
  std::function<void(bool)> on_drain;
  {
    MutexLock lock(&hooks_mu_);
    on_drain = on_drain_;
  }
  const bool was = core_.StopDraining();
  if (on_drain) on_drain(false);
  return was;
}

}  // namespace meshnet::rpc
