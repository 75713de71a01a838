#include "rpc/channel.h"

#include <algorithm>
#include <cmath>

#include "rpc/auth.h"
#include "rpc/codec.h"
#include "rpc/grpc_runtime.h"

namespace meshnet::rpc {

std::chrono::system_clock::time_point DeadlineAfter(double seconds) {
  constexpr double kMaxSeconds = 365.0 * 24 * 3600;
  const double s = std::isnan(seconds) ? 0.0 : std::clamp(seconds, 0.0, kMaxSeconds);
  return std::chrono::system_clock::now() +
         std::chrono::microseconds(static_cast<int64_t>(s * 1e6));
}

std::shared_ptr<grpc::Channel> MakeClientChannel(const std::string& address,
                                                 const ClientOptions& o) {
  QuietAbslDebugChecks();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Reconnect quickly after a node restarts; the generator decides what is dead.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // gRPC reads this one as the least time it gives a connection attempt (TCP,
  // TLS handshake, HTTP/2 settings: the "min connect timeout"), not as a
  // backoff. It was 100 ms: a TLS connect to a busy server, or over a link of
  // more than ~25 ms one-way, failed every attempt (48 clients connecting at
  // once to a TLS registry on 2 cores all failed). Calls keep their own
  // deadlines; a refused connection is still retried after the backoff above.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
  // One connection per endpoint object, not shared through the global pool.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!o.tls_ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadPemFile(o.tls_ca, "TLS CA");
    if (!o.tls_cert.empty()) {
      ssl.pem_cert_chain = ReadPemFile(o.tls_cert, "TLS certificate");
      ssl.pem_private_key = ReadPemFile(o.tls_key, "TLS key");
    }
    creds = grpc::SslCredentials(ssl);
    if (!o.tls_server_name.empty()) args.SetSslTargetNameOverride(o.tls_server_name);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  return grpc::CreateCustomChannel(address, creds, args);
}

}  // namespace meshnet::rpc
