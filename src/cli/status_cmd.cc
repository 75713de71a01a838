// meshnet status --registry ...: the nodes a registry knows, their ranges,
// load and free KV, and the routes that can serve each model.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "cli/command.h"
#include "cli/flags.h"
#include "registry/status.h"
#include "rpc/registry_client.h"
#include "util/error.h"

namespace meshnet::cli {
namespace {

struct StatusFlags {
  std::string registry;
  std::string output = "text";
  std::string model_id;
  ClientSecurityFlags client;
  registry::EtcdSecurity etcd;
  double timeout_s = 5.0;
};

int RunStatus(const StatusFlags& f) {
  if (f.output != "text" && f.output != "json") {
    ThrowInvalidArgument("--output must be text or json, got '" + f.output + "'");
  }
  rpc::ClientOptions co;
  CopyClientSecurityFlags(f.client, &co);
  co.info_timeout_s = f.timeout_s;
  const auto reg = rpc::OpenRegistry(f.registry, co, f.etcd);
  const nlohmann::json status = registry::StatusJson(reg->List(f.model_id), reg->name());
  if (f.output == "json") {
    std::cout << status.dump() << "\n";
  } else {
    std::cout << registry::StatusText(status);
  }
  return 0;
}

const CommandRegistrar kStatusCommand(
    {"status", "Nodes, ranges, load, free KV and routes known to a registry",
     [](CLI::App* sub, int* exit_code) {
       auto f = std::make_shared<StatusFlags>();
       sub->add_option("--registry", f->registry,
                       "HOST:PORT (meshnet registry), etcd://HOST:PORT/prefix or "
                       "etcds://HOST:PORT/prefix (TLS)")
           ->required();
       sub->add_option("--output", f->output, "text or json")->capture_default_str();
       sub->add_option("--model-id", f->model_id, "Only this model identity");
       AddClientSecurityFlags(sub, &f->client, "Cluster token",
                              "CA certificate (PEM) to verify the registry");
       AddEtcdFlags(sub, &f->etcd);
       sub->add_option("--timeout", f->timeout_s, "Deadline of the registry call in seconds")
           ->capture_default_str();
       sub->callback([f, exit_code] { *exit_code = RunStatus(*f); });
     }});

}  // namespace
}  // namespace meshnet::cli
