// Options of the gRPC node and client. No gRPC types: the CLI includes this.
//
// Thread-safety: value types.
#pragma once

#include <cstdint>
#include <string>

#include "node/admission.h"
#include "util/dtype.h"

namespace meshnet::rpc {

// How a client reaches nodes (meshnet generate --nodes ...).
struct ClientOptions {
  std::string auth_token;  // cluster token, sent as "authorization: Bearer <token>"
  // TLS: enabled when tls_ca is set (the CA that signed the nodes'
  // certificates). tls_cert + tls_key: this client's certificate for
  // nodes that require mutual TLS.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;  // expected name in the node certificates (default: the host)

  double connect_timeout_s = 2.0;      // waiting for a (re)connection before a call is "dead"
  double info_timeout_s = 2.0;         // deadline of Info calls
  double timeout_s = 30.0;             // deadline of one Step (or Truncate) call
  int step_retries = 1;                // re-sends of a step (same step id) on UNAVAILABLE
  KvDtype wire_dtype = KvDtype::kF32;  // dtype of bundles on the wire (f32 is exact)
  bool want_logits = false;            // ask the tail for the full logits row
  // Steps of several sessions waiting for the same node at the same time
  // (one client driving many sessions) go out as one StepMany call, one call
  // in flight per node: see RemoteEndpoint::Step (rpc/remote.h).
  bool group_steps = true;
  // How long a node's next call may wait for the sessions of this process
  // that are between two steps, so that a group's members, which wake one
  // after another, go on as one call (0..60 s).
  double transit_wait_s = 0.002;
  // At most this many grouped step calls of a route in flight at once (0: no
  // limit), the call to the earliest layers first: 1 moves all sessions as
  // one cohort (the whole batch on each node in turn: the most tokens per
  // CPU-second when the nodes share a machine's cores), the number of hops
  // lets every node compute at once (pipelining, for nodes on machines of
  // their own). See util::RankGate.
  int pipeline_depth = 0;
  // With pipeline_depth 1 (and group_steps, without want_logits): one thread
  // carries the cohort's decode steps through every hop, sending each hop's
  // answers on to the next (mesh::CohortCarrier) instead of waking every
  // session's thread at each hop.
  bool carry_cohorts = true;
  // A node marked dead is left out of plans for this long, unless its Info
  // shows a new instance (it restarted).
  double dead_cooldown_s = 30.0;
  // Plans made within this many seconds of a survey of every node (their
  // Info: layers, load, free KV) reuse it, counting the sessions planned
  // since on top of each node's load; concurrent plans share one survey in
  // flight. A survey in which some node did not answer, or a node marked dead
  // since, is not reused. 0: every plan asks every node.
  double survey_max_age_s = 1.0;
  // When set: Plan refuses nodes whose model identity (node::ModelIdentity)
  // differs, e.g. the model the client's tokenizer was read from.
  std::string expected_model_id;
  // Session pushes (drain, rpc/migrate.h) send the KV over the target's KV
  // transfer port when it has one (plaintext only); false: always the gRPC
  // stream.
  bool kv_transfer = true;
  // Chain forwarding (rpc/forward.h): a step goes to the head only, each
  // node sends its bundle on to the next, and the tail's answer comes
  // straight back on a Returns stream (hops + 1 link crossings a step instead
  // of 2 x hops). false: the client relays every hop (star).
  bool chain = false;

  // Throws Error(kInvalidArgument) naming the bad field (timeouts > 0,
  // retries >= 0, cert and key given together, key or cert without CA...).
  void Validate() const;
};

// Whether host:port names a loopback address (127.0.0.0/8, [::1], localhost).
bool IsLoopbackListen(const std::string& listen);

// A node's server side (meshnet serve).
struct NodeServerOptions {
  std::string listen = "127.0.0.1:0";  // host:port; port 0 picks a free one
  std::string metrics_listen;          // host:port of /metrics; empty: no exposer
  std::string auth_token;              // empty: no cluster token required
  // The host:port others reach this node at, when it is not `listen` (a NAT,
  // a proxy): what it announces and proves, and its name on a chain route.
  // Empty: the bound address.
  std::string advertise;
  // The operator's credential for Drain/Undrain (never the cluster token;
  // Validate refuses the same value). Empty: admin calls are refused.
  std::string admin_token;
  // PEM file of the node's Ed25519 key (created on first use); empty: a
  // fresh key per process.
  std::string node_key_file;
  std::string tls_cert;                     // server certificate chain (PEM); enables TLS
  std::string tls_key;                      // its private key (PEM)
  std::string tls_ca;                       // if set: require client certificates signed by it
  int max_rpc_threads = 64;                 // gRPC handler threads
  int64_t max_bindings = 4096;              // session bindings remembered (see node/node_core.h)
  int64_t replay_cache_bytes = 64LL << 20;  // bytes of cached step results for retries
  // Listening on a non-loopback address needs a cluster token or client
  // certificates (tls_ca) unless this is set (meshnet serve --insecure).
  bool insecure = false;
  // Largest message received or sent; 0: from the shard (a full-context
  // bundle and its logits, plus headroom). The token is checked before a
  // body is read (rpc/server_auth.h): this bounds what a caller with it costs.
  int64_t max_message_bytes = 0;
  int max_streams = 8;           // concurrent StepStream calls (each pins a handler thread)
  int max_return_streams = 256;  // open Returns streams (chain forwarding; no thread each)
  int max_calls_per_peer = 32;   // concurrent Step/StepStream/Truncate calls per peer
  // Sessions one peer may open per minute (rpc/server_limits.h); 1..10^6.
  int64_t max_new_sessions_per_minute = 3000;
  node::AdmissionOptions admission;  // new sessions when the node is full (node/admission.h)
  // How this node reaches replicas when it drains (rpc/drain.h); an empty
  // auth_token there means this node's own cluster token.
  ClientOptions peers;
  // The port imports' KV bytes come in on (rpc/kv_transfer.h), on the
  // --listen host: 0 any free one, -1 none (imports stream over gRPC). A
  // node serving TLS opens none.
  int kv_transfer_port = 0;

  void Validate() const;
};

}  // namespace meshnet::rpc
