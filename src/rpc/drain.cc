#include "rpc/drain.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <utility>

#include "proto/meshnet.grpc.pb.h"
#include "rpc/auth.h"
#include "rpc/channel.h"
#include "rpc/migrate.h"
#include "rpc/status.h"
#include "util/error.h"
#include "util/host_port.h"
#include "util/mutex.h"

namespace meshnet::rpc {

namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr const char* kEndedDetail =
    "node draining: no replica took the session; re-prefill on another route";

// Moves one session to the first replica that takes it, or ends it.
void DrainOne(node::NodeCore& core, const std::string& id, const node::ShardInfo& self,
              const DrainOptions& o, bool out_of_time, DrainReport* report) {
  std::unique_ptr<node::SessionExporter> exp;
  try {
    exp = core.BeginExport(id, nullptr);
  } catch (const Error& e) {
    // No live state (already a miss for its client) or busy past the wait.
    report->notes.push_back("session " + id.substr(0, 8) + ": not exported (" + e.what() + ")");
    core.EndSession(id, kEndedDetail);
    ++report->ended;
    return;
  }
  const int64_t bytes = exp->header().seq_len * exp->header().bytes_per_token;
  std::vector<DrainTarget> targets;
  if (o.find_replicas && !out_of_time) targets = o.find_replicas(self, bytes);
  for (const DrainTarget& target : targets) {
    try {
      const std::string at = CanonicalHostPort(target.address);
      report->bytes_moved += PushSession(*exp, target, self, o.client);
      core.MarkMoved(id, at);
      ++report->moved;
      spdlog::info("event=session_moved session={} to={} bytes={}", id.substr(0, 8), at, bytes);
      return;
    } catch (const Error& e) {
      report->notes.push_back("session " + id.substr(0, 8) + ": " + target.address + " refused (" +
                              e.what() + ")");
      spdlog::warn("event=move_refused session={} to={} message=\"{}\"", id.substr(0, 8),
                   target.address, e.what());
    }
  }
  exp.reset();  // ends the claim
  core.EndSession(id, kEndedDetail);
  ++report->ended;
}

}  // namespace

ReplicaFinder StaticReplicas(std::vector<std::string> addresses) {
  std::vector<DrainTarget> targets;
  for (auto& a : addresses) targets.push_back({std::move(a), ""});
  return [targets = std::move(targets)](const node::ShardInfo&, int64_t) { return targets; };
}

namespace {

void Merge(const DrainReport& one, DrainReport* into) {
  into->moved += one.moved;
  into->ended += one.ended;
  into->bytes_moved += one.bytes_moved;
  into->notes.insert(into->notes.end(), one.notes.begin(), one.notes.end());
}

}  // namespace

DrainReport DrainSessions(node::NodeCore& core, const DrainOptions& options) {
  const auto t0 = SteadyClock::now();
  const auto deadline =
      t0 + std::chrono::milliseconds(static_cast<int64_t>(options.deadline_s * 1000));
  core.StartDraining();
  DrainReport report;
  const std::vector<std::string> ids = core.MovableSessions();
  report.sessions = static_cast<int64_t>(ids.size());
  const node::ShardInfo self = core.node().Info();
  spdlog::info("event=drain_begin sessions={} parallel={}", ids.size(), options.parallel);
  // Workers take the next session until none is left; each merges its own
  // report under the lock (no lock is held across a transfer).
  Mutex mu;
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < ids.size();) {
      DrainReport one;
      DrainOne(core, ids[i], self, options, SteadyClock::now() >= deadline, &one);
      MutexLock lock(&mu);
      Merge(one, &report);
    }
  };
  const size_t workers = std::min(ids.size(), static_cast<size_t>(std::max(1, options.parallel)));
  std::vector<std::thread> threads;
  for (size_t k = 1; k < workers; ++k) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  report.seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  spdlog::info("event=drain_end sessions={} moved={} ended={} bytes={} seconds={:.3f}",
               report.sessions, report.moved, report.ended, report.bytes_moved, report.seconds);
  return report;
}

namespace {

// One admin call: TLS from `options`, the admin token, no cluster token.
template <typename Req, typename Resp, typename Method>
Resp AdminCall(const std::string& address, const ClientOptions& options,
               const std::string& admin_token, Method method, const Req& req, const char* name) {
  options.Validate();
  auto stub = pb::MeshNode::NewStub(MakeChannel(address, options));
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(options.timeout_s));
  if (!admin_token.empty()) ctx.AddMetadata("authorization", BearerValue(admin_token));
  Resp resp;
  const grpc::Status s = (stub.get()->*method)(&ctx, req, &resp);
  if (!s.ok()) ThrowForStatus(s, ctx, address, name);
  return resp;
}

}  // namespace

DrainReport RequestDrain(const std::string& address, const std::vector<std::string>& targets,
                         const ClientOptions& options, const std::string& admin_token) {
  pb::DrainRequest req;
  for (const auto& t : targets) req.add_targets(t);
  const pb::DrainResponse resp = AdminCall<pb::DrainRequest, pb::DrainResponse>(
      address, options, admin_token, &pb::MeshNode::Stub::Drain, req, "Drain");
  DrainReport r;
  r.sessions = resp.sessions();
  r.moved = resp.moved();
  r.ended = resp.ended();
  r.bytes_moved = resp.bytes_moved();
  r.seconds = resp.seconds();
  r.notes.assign(resp.notes().begin(), resp.notes().end());
  return r;
}

bool RequestUndrain(const std::string& address, const ClientOptions& options,
                    const std::string& admin_token) {
  return AdminCall<pb::UndrainRequest, pb::UndrainResponse>(address, options, admin_token,
                                                            &pb::MeshNode::Stub::Undrain,
                                                            pb::UndrainRequest{}, "Undrain")
      .was_draining();
}

}  // namespace meshnet::rpc
