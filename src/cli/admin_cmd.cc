// meshnet admin: operator requests to a running node.
//
//   meshnet admin drain ADDR [--to ADDR2[,ADDR3]]
//
// asks the node at ADDR to stop taking new sessions and hand every live
// session's KV to one of the replicas (rpc/drain.h); without --to, a node
// started with --registry finds them in its registry. Prints one summary line
// on stdout and each refusal on stderr; exit 0 when the node answered.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/flags.h"
#include "rpc/drain.h"
#include "rpc/remote.h"
#include "util/error.h"

namespace meshnet::cli {
namespace {

struct DrainFlags {
  std::string address;
  std::string to;
  ClientSecurityFlags client;
  double timeout_s = 60.0;
};

int RunDrain(const DrainFlags& f) {
  rpc::ClientOptions co;
  CopyClientSecurityFlags(f.client, &co);
  co.auth_token = AuthTokenOrEnv(f.client.auth_token);
  co.timeout_s = f.timeout_s;
  co.Validate();
  const std::string address = rpc::ParseNodeList(f.address).at(0);
  const std::vector<std::string> targets =
      f.to.empty() ? std::vector<std::string>{} : rpc::ParseNodeList(f.to);
  const rpc::DrainReport r = rpc::RequestDrain(address, targets, co);
  for (const auto& note : r.notes) std::fprintf(stderr, "meshnet: %s\n", note.c_str());
  std::printf(
      "drained %s: %lld sessions, %lld moved, %lld ended (re-prefill elsewhere), %lld bytes of "
      "KV in %.3f s\n",
      address.c_str(), static_cast<long long>(r.sessions), static_cast<long long>(r.moved),
      static_cast<long long>(r.ended), static_cast<long long>(r.bytes_moved), r.seconds);
  return 0;
}

const CommandRegistrar kAdminCommand(
    {"admin", "Operator requests to a running node (drain)", [](CLI::App* sub, int* exit_code) {
       sub->require_subcommand(1);
       auto f = std::make_shared<DrainFlags>();
       CLI::App* drain = sub->add_subcommand(
           "drain",
           "Stop a node taking new sessions and move its live sessions' KV to replicas of its "
           "layer range (sessions no replica takes end with a miss and re-prefill elsewhere)");
       drain->add_option("address", f->address, "host:port of the node to drain")->required();
       drain->add_option("--to", f->to,
                         "host:port,... of replicas of the same layer range (none: the "
                         "registry's replicas if the node has --registry, else every "
                         "session ends)");
       AddClientSecurityFlags(drain, &f->client, "Cluster token (default: $MESHNET_AUTH_TOKEN)",
                              "CA certificate (PEM) to verify the node");
       drain->add_option("--timeout", f->timeout_s, "Deadline of the whole drain in seconds")
           ->capture_default_str();
       drain->callback([f, exit_code] { *exit_code = RunDrain(*f); });
     }});

}  // namespace
}  // namespace meshnet::cli
