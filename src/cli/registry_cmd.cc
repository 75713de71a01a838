// meshnet registry: the embedded node registry on its own (the same service
// `meshnet serve --registry-listen` runs inside a node), with its status page.
//
// stdout: "registry on HOST:PORT", then with --http-listen "registry page on
// HOST:PORT". SIGINT/SIGTERM stop it.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/flags.h"
#include "registry/status_http.h"
#include "rpc/registry_server.h"
#include "util/stop_signals.h"

namespace meshnet::cli {
namespace {

struct RegistryFlags {
  std::string listen = "127.0.0.1:0";
  std::string http_listen;
  ServerSecurityFlags security;
  std::string node_tls_ca;
  std::string node_tls_cert;
  std::string node_tls_key;
  bool insecure = false;
};

rpc::RegistryServerOptions ServerOptions(const RegistryFlags& f) {
  rpc::RegistryServerOptions o;
  o.listen = f.listen;
  CopyServerSecurityFlags(f.security, &o);
  o.insecure = f.insecure;
  o.node_client.auth_token = o.auth_token;
  o.node_client.tls_ca = f.node_tls_ca;
  o.node_client.tls_cert = f.node_tls_cert;
  o.node_client.tls_key = f.node_tls_key;
  return o;
}

int RunRegistry(const RegistryFlags& f) {
  StopSignals stop;
  spdlog::set_default_logger(spdlog::stderr_color_mt("meshnet"));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e level=%l %v");
  rpc::RegistryServer server(ServerOptions(f));
  server.Start();
  std::printf("registry on %s\n", server.bound_address().c_str());
  std::unique_ptr<registry::StatusHttpServer> page;
  if (!f.http_listen.empty()) {
    page = std::make_unique<registry::StatusHttpServer>(&server.registry());
    std::printf("registry page on %s\n", page->Start(f.http_listen).c_str());
  }
  std::fflush(stdout);
  stop.Arm();
  stop.Wait();
  if (page) page->Stop();
  server.Shutdown();
  return 0;
}

const CommandRegistrar kRegistryCommand(
    {"registry", "Serve the embedded node registry (leases, watch, status page)",
     [](CLI::App* sub, int* exit_code) {
       auto f = std::make_shared<RegistryFlags>();
       sub->add_option("--listen", f->listen,
                       "host:port of the Registry gRPC service (port 0: "
                       "a free one; printed as 'registry on HOST:PORT')")
           ->capture_default_str();
       sub->add_option("--http-listen", f->http_listen,
                       "host:port of the status page (/), /status.json and /metrics");
       AddServerSecurityFlags(sub, &f->security,
                              "Cluster token every call must carry; announced nodes must prove "
                              "they know it (it is never sent to them) (default: "
                              "$MESHNET_AUTH_TOKEN)");
       sub->add_option("--node-tls-ca", f->node_tls_ca, "CA (PEM) to verify nodes over TLS");
       sub->add_option("--node-tls-cert", f->node_tls_cert, "Client certificate for the nodes");
       sub->add_option("--node-tls-key", f->node_tls_key, "Client private key for the nodes");
       sub->add_flag("--insecure", f->insecure,
                     "Allow a non-loopback --listen without --auth-token or --tls-ca");
       sub->callback([f, exit_code] { *exit_code = RunRegistry(*f); });
     }});

}  // namespace
}  // namespace meshnet::cli
