#include "rpc/options.h"

#include <charconv>
#include <cmath>

#include "util/error.h"
#include "util/host_port.h"

namespace meshnet::rpc {

namespace {

void CheckPositive(double v, const char* name) {
  if (!(v > 0) || !std::isfinite(v)) {
    ThrowInvalidArgument(std::string(name) + " must be a positive number of seconds");
  }
}

// host:port with a non-empty host and a port in 0..65535 ("[::1]:0" too).
void CheckHostPort(const std::string& text, const char* flag) {
  const size_t colon = text.rfind(':');
  bool ok = colon != std::string::npos && colon > 0 && colon + 1 < text.size();
  if (ok) {
    int port = -1;
    const char* p = text.data() + colon + 1;
    const char* end = text.data() + text.size();
    auto [q, ec] = std::from_chars(p, end, port);
    ok = ec == std::errc() && q == end && port >= 0 && port <= 65535;
  }
  if (!ok) {
    ThrowInvalidArgument(std::string(flag) + " '" + text +
                         "' must be host:port with a port in 0..65535 (0 picks a free port)");
  }
}

}  // namespace

bool IsLoopbackListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  const std::string host = listen.substr(0, colon == std::string::npos ? listen.size() : colon);
  return host == "localhost" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

void ClientOptions::Validate() const {
  CheckPositive(connect_timeout_s, "connect timeout");
  CheckPositive(info_timeout_s, "info timeout");
  CheckPositive(timeout_s, "step timeout");
  if (!(dead_cooldown_s >= 0) || !std::isfinite(dead_cooldown_s)) {
    ThrowInvalidArgument("dead-node cooldown must be >= 0 seconds");
  }
  if (!(survey_max_age_s >= 0 && survey_max_age_s <= 3600)) {
    ThrowInvalidArgument("survey max age must be 0..3600 seconds");
  }
  if (step_retries < 0) ThrowInvalidArgument("step retries must be >= 0");
  if (!(transit_wait_s >= 0 && transit_wait_s <= 60)) {
    ThrowInvalidArgument("transit wait must be 0..60 seconds");
  }
  if (pipeline_depth < 0) ThrowInvalidArgument("pipeline depth must be >= 0 (0: no limit)");
  if (tls_cert.empty() != tls_key.empty()) {
    ThrowInvalidArgument("--tls-cert and --tls-key must be given together");
  }
  if (!tls_cert.empty() && tls_ca.empty()) {
    ThrowInvalidArgument("a client certificate (--tls-cert) needs --tls-ca to verify the nodes");
  }
  if (!tls_server_name.empty() && tls_ca.empty()) {
    ThrowInvalidArgument("--tls-server-name needs --tls-ca (TLS)");
  }
}

void NodeServerOptions::Validate() const {
  CheckHostPort(listen, "--listen");
  if (!advertise.empty()) {
    CheckHostPort(advertise, "--advertise");
    try {
      (void)CanonicalHostPort(advertise);
    } catch (const Error& e) {
      ThrowInvalidArgument("--advertise " + advertise + ": " + e.what());
    }
  }
  if (!metrics_listen.empty()) CheckHostPort(metrics_listen, "--metrics-listen");
  if (tls_cert.empty() != tls_key.empty()) {
    ThrowInvalidArgument("--tls-cert and --tls-key must be given together");
  }
  if (!tls_ca.empty() && tls_cert.empty()) {
    ThrowInvalidArgument("--tls-ca (client certificate verification) needs --tls-cert/--tls-key");
  }
  if (max_rpc_threads < 2) ThrowInvalidArgument("max rpc threads must be >= 2");
  if (!insecure && auth_token.empty() && tls_ca.empty() && !IsLoopbackListen(listen)) {
    ThrowInvalidArgument("--listen " + listen +
                         " is reachable from other machines but no --auth-token (or "
                         "MESHNET_AUTH_TOKEN) or --tls-ca (client certificates) is set: anyone "
                         "could use and fill this node. Give one, or --insecure to serve openly");
  }
  if (max_message_bytes < 0 || max_message_bytes > (int64_t{1} << 31) - 1) {
    ThrowInvalidArgument("--max-message-bytes must be in 0..2147483647");
  }
  if (!admin_token.empty() && admin_token == auth_token) {
    ThrowInvalidArgument(
        "--admin-token must differ from the cluster token (every node and client holds that "
        "one)");
  }
  if (max_streams < 0) ThrowInvalidArgument("max streams must be >= 0");
  if (max_return_streams < 0) ThrowInvalidArgument("max return streams must be >= 0");
  if (max_calls_per_peer < 1) ThrowInvalidArgument("max calls per peer must be >= 1");
  if (max_new_sessions_per_minute < 1 || max_new_sessions_per_minute > 1000000) {
    ThrowInvalidArgument("--max-new-sessions-per-minute must be in 1..1000000");
  }
  if (admission.max_active < 0) ThrowInvalidArgument("admission max active must be >= 0");
  if (max_bindings < 1) ThrowInvalidArgument("max bindings must be >= 1");
  if (replay_cache_bytes < 0) ThrowInvalidArgument("replay cache bytes must be >= 0");
  if (kv_transfer_port < -1 || kv_transfer_port > 65535) {
    ThrowInvalidArgument("--kv-transfer-port must be -1 (none), 0 (any free port) or a port");
  }
}

}  // namespace meshnet::rpc
