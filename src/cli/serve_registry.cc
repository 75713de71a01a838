#include "cli/serve_registry.h"

#include <spdlog/spdlog.h>

#include <cstdio>

#include "cli/flags.h"
#include "registry/announcer.h"
#include "registry/status_http.h"
#include "rpc/registry_client.h"
#include "rpc/registry_server.h"
#include "rpc/server.h"
#include "util/error.h"
#include "util/host_port.h"

namespace meshnet::cli {

namespace {

class Running final : public ServeRegistry {
 public:
  ~Running() override {
    if (announcer) announcer->Stop();  // withdraws before the registry goes
    if (page) page->Stop();
    if (server) server->Shutdown();
  }
  // At once in the registry (a heartbeat now, waited for: a drain is visible
  // before it moves anything), and in every later heartbeat.
  void SetDraining(bool draining) override {
    if (!announcer->SetDraining(draining)) {  // unreachable now: the next beat retries
      spdlog::warn("event=set_draining_failed registry={} draining={}", client->name(), draining);
    }
  }
  registry::Registry& registry() override { return *client; }
  registry::NodeRecord record() const override { return rpc::NodeRecordOf(*node); }
  const rpc::NodeServer* node = nullptr;
  std::unique_ptr<rpc::RegistryServer> server;
  std::unique_ptr<registry::StatusHttpServer> page;
  std::unique_ptr<registry::Registry> client;
  std::unique_ptr<registry::Announcer> announcer;
};

}  // namespace

void AddServeRegistryFlags(CLI::App* sub, ServeRegistryFlags* f) {
  sub->add_option("--registry", f->registry,
                  "Announce this node to a registry: HOST:PORT (meshnet registry), "
                  "etcd://HOST:PORT/prefix or etcds://HOST:PORT/prefix (TLS)");
  AddEtcdFlags(sub, &f->etcd);
  sub->add_option("--registry-listen", f->registry_listen,
                  "Also serve an embedded registry on host:port (port 0: a free one; printed "
                  "as 'registry on HOST:PORT'); the node announces itself there unless "
                  "--registry names another");
  sub->add_option("--registry-http", f->registry_http,
                  "With --registry-listen: host:port of its status page, /status.json and "
                  "/metrics (printed as 'registry page on HOST:PORT')");
  sub->add_option("--lease-ttl", f->lease_ttl_s,
                  "Seconds the registry keeps this node without a heartbeat (renewed every "
                  "third of it; registries grant at most 60)")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 3600.0));
}

std::unique_ptr<ServeRegistry> StartServeRegistry(const ServeRegistryFlags& f,
                                                  const rpc::NodeServer& server,
                                                  const std::string& token,
                                                  const std::string& tls_ca,
                                                  const std::string& tls_cert,
                                                  const std::string& tls_key, bool insecure) {
  if (f.registry.empty() && f.registry_listen.empty()) {
    if (!f.registry_http.empty()) ThrowInvalidArgument("--registry-http needs --registry-listen");
    return nullptr;
  }
  // What the node announces and proves is its own name: a wildcard listen
  // (0.0.0.0, [::]) names no host others can reach.
  if (server.advertised_address().empty()) {
    ThrowInvalidArgument(
        "--registry: this node cannot announce itself: its --listen names no host others reach "
        "it by; give --listen such a host, or --advertise");
  }
  auto r = std::make_unique<Running>();
  rpc::ClientOptions co;  // how this process reaches nodes and registries
  co.auth_token = token;
  co.tls_ca = tls_ca;
  co.tls_cert = tls_ca.empty() ? "" : tls_cert;
  co.tls_key = tls_ca.empty() ? "" : tls_key;
  std::string target = f.registry;
  if (!f.registry_listen.empty()) {
    rpc::RegistryServerOptions ro;
    ro.listen = f.registry_listen;
    ro.auth_token = token;
    ro.tls_cert = tls_cert;
    ro.tls_key = tls_key;
    ro.tls_ca = tls_ca;
    ro.insecure = insecure;
    ro.node_client = co;
    r->server = std::make_unique<rpc::RegistryServer>(ro);
    r->server->Start();
    std::printf("registry on %s\n", r->server->bound_address().c_str());
    if (!f.registry_http.empty()) {
      r->page = std::make_unique<registry::StatusHttpServer>(&r->server->registry());
      std::printf("registry page on %s\n", r->page->Start(f.registry_http).c_str());
    }
    if (target.empty()) target = r->server->bound_address();
  }
  r->client = rpc::OpenRegistry(target, co, f.etcd);
  const rpc::NodeServer* node = &server;
  r->node = node;
  r->announcer = std::make_unique<registry::Announcer>(
      r->client.get(), [node](bool draining) { return rpc::NodeRecordOf(*node, draining); },
      f.lease_ttl_s);
  r->announcer->Start();
  std::fflush(stdout);
  return r;
}

}  // namespace meshnet::cli
