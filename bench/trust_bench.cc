// What the identity checks cost (README "Threat model"), each against a
// baseline measured in the same run:
//   BM_Ed25519Sign / BM_Ed25519Verify   one signature / one check (32 B key)
//   BM_ProveVsInfo    a Prove round trip (challenge, sign, verify, member
//                     proof) against an Info round trip on the same warm
//                     channel, alternating (vs_info = prove / info)
//   BM_AnnounceVerifiedVsNot  one Announce to a registry that has the node
//                     prove itself against one to a registry that does not
//                     (verify_nodes = false), alternating
//   BM_PushProvedSession  a drain's push of one session of the shipped model
//                     (prove + offer + transfer port) against the Prove alone
//                     (prove_share = prove / push)
// All on 127.0.0.1, in this process.
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>

#include "gguf/gguf_reader.h"
#include "node/identity.h"
#include "node/node.h"
#include "node/node_core.h"
#include "proto/meshnet.grpc.pb.h"
#include "registry/record.h"
#include "rpc/channel.h"
#include "rpc/migrate.h"
#include "rpc/prove.h"
#include "rpc/registry_client.h"
#include "rpc/registry_server.h"
#include "rpc/remote.h"
#include "rpc/server.h"
#include "util/signing_key.h"

namespace meshnet {
namespace {

using Clock = std::chrono::steady_clock;
const std::string kToken = "bench-token";
const std::string kSecret = "bench-secret";

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::shared_ptr<const gguf::GgufFile> File() {
  static auto f =
      std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(MESHNET_SHIPPED_MODEL));
  return f;
}

struct Served {
  Served() {
    node::NodeOptions o;
    o.layers = node::LayerRange{0, 4};
    o.kv_config.budget_bytes = 64 << 20;
    o.kv_config.max_sessions = 64;
    node = std::make_unique<node::Node>(File(), o, nullptr);
    rpc::NodeServerOptions so;
    so.auth_token = kToken;
    server = std::make_unique<rpc::NodeServer>(node.get(), so);
    server->Start();
  }
  std::unique_ptr<node::Node> node;
  std::unique_ptr<rpc::NodeServer> server;
};

void BM_Ed25519Sign(benchmark::State& state) {
  const SigningKey key = SigningKey::Generate();
  const std::string msg(256, 'm');
  for (auto _ : state) benchmark::DoNotOptimize(key.Sign(msg));
}
BENCHMARK(BM_Ed25519Sign);

void BM_Ed25519Verify(benchmark::State& state) {
  const SigningKey key = SigningKey::Generate();
  const std::string msg(256, 'm');
  const std::string sig = key.Sign(msg);
  for (auto _ : state) benchmark::DoNotOptimize(VerifySignature(key.public_key(), msg, sig));
}
BENCHMARK(BM_Ed25519Verify);

void BM_ProveVsInfo(benchmark::State& state) {
  Served s;
  rpc::ClientOptions co;
  co.auth_token = kToken;
  auto stub = v1::MeshNode::NewStub(rpc::MakeClientChannel(s.server->bound_address(), co));
  double prove_s = 0, info_s = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    benchmark::DoNotOptimize(rpc::ProveOn(*stub, s.server->bound_address(), co));
    prove_s += Seconds(t0);
    state.PauseTiming();
    t0 = Clock::now();
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + kToken);
    v1::InfoResponse info;
    stub->Info(&ctx, v1::InfoRequest{}, &info);
    info_s += Seconds(t0);
    state.ResumeTiming();
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["prove_us"] = prove_s / n * 1e6;
  state.counters["info_us"] = info_s / n * 1e6;
  state.counters["vs_info"] = prove_s / info_s;
}
BENCHMARK(BM_ProveVsInfo)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_AnnounceVerifiedVsNot(benchmark::State& state) {
  Served s;
  rpc::RegistryServerOptions vo;
  vo.auth_token = kToken;
  vo.node_client.auth_token = kToken;
  rpc::RegistryServer verified(vo);
  verified.Start();
  rpc::RegistryServerOptions po = vo;
  po.verify_nodes = false;
  rpc::RegistryServer plain(po);
  plain.Start();
  rpc::ClientOptions co;
  co.auth_token = kToken;
  rpc::RemoteRegistry a(verified.bound_address(), co), b(plain.bound_address(), co);
  double verified_s = 0, plain_s = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    a.Announce(rpc::NodeRecordOf(*s.server), 30);
    verified_s += Seconds(t0);
    state.PauseTiming();
    t0 = Clock::now();
    b.Announce(rpc::NodeRecordOf(*s.server), 30);
    plain_s += Seconds(t0);
    state.ResumeTiming();
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["verified_us"] = verified_s / n * 1e6;
  state.counters["plain_us"] = plain_s / n * 1e6;
  state.counters["vs_plain"] = verified_s / plain_s;
}
BENCHMARK(BM_AnnounceVerifiedVsNot)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_PushProvedSession(benchmark::State& state) {
  Served target;
  node::NodeOptions o;
  o.layers = node::LayerRange{0, 4};
  o.kv_config.budget_bytes = 64 << 20;
  node::Node source(File(), o, nullptr);
  node::NodeCore core(&source);
  rpc::ClientOptions co;
  co.auth_token = kToken;
  auto stub = v1::MeshNode::NewStub(rpc::MakeClientChannel(target.server->bound_address(), co));
  rpc::RemoteEndpoint on_target(target.server->bound_address(), co);
  double push_s = 0, prove_s = 0;
  for (auto _ : state) {
    state.PauseTiming();
    node::StepRequest r;
    r.session_id = node::RandomId128();
    r.session_secret = kSecret;
    r.prefill = true;
    for (int i = 0; i < 200; ++i) r.token_ids.push_back(1 + i % 400);
    core.Step(r);
    auto exp = core.BeginExport(r.session_id, &kSecret);
    state.ResumeTiming();
    auto t0 = Clock::now();
    rpc::PushSession(*exp, {target.server->bound_address(), ""}, source.Info(), co);
    push_s += Seconds(t0);
    state.PauseTiming();
    t0 = Clock::now();
    benchmark::DoNotOptimize(rpc::ProveOn(*stub, target.server->bound_address(), co));
    prove_s += Seconds(t0);
    exp.reset();
    core.Release(r.session_id, kSecret, 0);
    on_target.ReleaseOrThrow(r.session_id, kSecret, 0);
    state.ResumeTiming();
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["push_us"] = push_s / n * 1e6;
  state.counters["prove_us"] = prove_s / n * 1e6;
  state.counters["prove_share"] = prove_s / push_s;
}
BENCHMARK(BM_PushProvedSession)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace meshnet

BENCHMARK_MAIN();
