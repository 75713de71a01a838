// meshnet admin: operator requests to a running node, authorized by the
// node's admin token (--admin-token or $MESHNET_ADMIN_TOKEN), never the
// cluster token.
//
//   meshnet admin drain ADDR [--to ADDR2[,ADDR3]]
//   meshnet admin undrain ADDR
//
// drain asks the node at ADDR to stop taking new sessions and hand every
// live session's KV to one of the replicas (rpc/drain.h), each of which must
// first prove to the node that it is a node of the same range (rpc/prove.h);
// without --to, a node started with --registry finds them in its registry.
// undrain lets it take new sessions again. Each prints one summary line on
// stdout (and each refusal on stderr); exit 0 when the node answered.
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

struct AdminFlags {
  std::string address;
  std::string to;
  std::string admin_token;
  ClientSecurityFlags client;
  double timeout_s = 60.0;
};

rpc::ClientOptions AdminClient(const AdminFlags& f) {
  rpc::ClientOptions co;
  CopyClientSecurityFlags(f.client, &co);
  co.auth_token.clear();  // never sent: admin calls carry the admin token only
  co.timeout_s = f.timeout_s;
  co.Validate();
  return co;
}

std::string AdminToken(const AdminFlags& f) {
  const std::string token = AdminTokenOrEnv(f.admin_token);
  if (token.empty()) {
    ThrowInvalidArgument(
        "meshnet admin needs the node's admin token: --admin-token or "
        "$MESHNET_ADMIN_TOKEN");
  }
  return token;
}

int RunDrain(const AdminFlags& f) {
  const rpc::ClientOptions co = AdminClient(f);
  const std::string token = AdminToken(f);
  const std::string address = rpc::ParseNodeList(f.address).at(0);
  const std::vector<std::string> targets =
      f.to.empty() ? std::vector<std::string>{} : rpc::ParseNodeList(f.to);
  const rpc::DrainReport r = rpc::RequestDrain(address, targets, co, token);
  for (const auto& note : r.notes) std::fprintf(stderr, "meshnet: %s\n", note.c_str());
  std::printf(
      "drained %s: %lld sessions, %lld moved, %lld ended (re-prefill elsewhere), %lld bytes of "
      "KV in %.3f s\n",
      address.c_str(), static_cast<long long>(r.sessions), static_cast<long long>(r.moved),
      static_cast<long long>(r.ended), static_cast<long long>(r.bytes_moved), r.seconds);
  return 0;
}

int RunUndrain(const AdminFlags& f) {
  const rpc::ClientOptions co = AdminClient(f);
  const std::string address = rpc::ParseNodeList(f.address).at(0);
  const bool was = rpc::RequestUndrain(address, co, AdminToken(f));
  std::printf("undrained %s: %s\n", address.c_str(),
              was ? "takes new sessions again" : "was not draining");
  return 0;
}

void AddAdminFlags(CLI::App* sub, AdminFlags* f, const char* what) {
  sub->add_option("address", f->address, std::string("host:port of the node to ") + what)
      ->required();
  sub->add_option("--admin-token", f->admin_token,
                  "The node's --admin-token (default: $MESHNET_ADMIN_TOKEN)");
  sub->add_option("--tls-ca", f->client.tls_ca, "CA certificate (PEM) to verify the node");
  sub->add_option("--tls-cert", f->client.tls_cert, "Client certificate (PEM) for mutual TLS");
  sub->add_option("--tls-key", f->client.tls_key, "Client private key (PEM) for mutual TLS");
  sub->add_option("--timeout", f->timeout_s, "Deadline of the call in seconds")
      ->capture_default_str();
}

const CommandRegistrar kAdminCommand(
    {"admin", "Operator requests to a running node (drain, undrain)",
     [](CLI::App* sub, int* exit_code) {
       sub->require_subcommand(1);
       auto f = std::make_shared<AdminFlags>();
       CLI::App* drain = sub->add_subcommand(
           "drain",
           "Stop a node taking new sessions and move its live sessions' KV to replicas of its "
           "layer range (sessions no replica takes end with a miss and re-prefill elsewhere)");
       AddAdminFlags(drain, f.get(), "drain");
       drain->add_option("--to", f->to,
                         "host:port,... of replicas of the same layer range, each proven by "
                         "the node before it gets anything (none: the registry's replicas if "
                         "the node has --registry, else every session ends)");
       drain->callback([f, exit_code] { *exit_code = RunDrain(*f); });
       auto u = std::make_shared<AdminFlags>();
       CLI::App* undrain =
           sub->add_subcommand("undrain", "Let a drained node take new sessions again");
       AddAdminFlags(undrain, u.get(), "undrain");
       undrain->callback([u, exit_code] { *exit_code = RunUndrain(*u); });
     }});

}  // namespace
}  // namespace meshnet::cli
