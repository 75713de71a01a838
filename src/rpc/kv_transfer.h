// KV transfer: a session import's bytes over a TCP connection of their own.
//
// The gRPC import (ImportSession) copies every KV byte four times on its way
// (into a protobuf message, into gRPC's buffers, out of them, out of the
// parsed message) besides the kernel's copies. Here the exporter sends the
// session's rows from where they live (sendmsg over the paged blocks, no
// copy), and the importer receives them straight into the rows it reserved
// (recv into the paged blocks), checksumming each block's run while it is in
// cache. Everything else is the gRPC import's: OfferImport (an authenticated
// gRPC call, token and all) verifies the header and reserves the rows
// (NodeCore::BeginImport) and answers a one-time ticket; the connection
// presents the ticket, then the chunks and the trailer in the export's order,
// and gets one status frame back. The chunks, CRC32Cs and session digest are
// verified exactly as over gRPC (node/migration.h); nothing is loaded unless
// everything checks out.
//
// Plain TCP only: a node serving TLS offers no port (the bytes would travel
// unencrypted), and its imports stay on the gRPC stream.
//
// Wire format (little-endian):
//   client: "MKVXFER1", 32-byte ticket;
//           per chunk: u32 kind = 1, u32 crc32c, i64 index, i64 first_position,
//                      i64 n_positions, i64 bytes, then `bytes` bytes;
//           trailer:   u32 kind = 2, u32 session digest, i64 0, i64 0, i64 0,
//                      i64 total bytes.
//   server: u32 status (0 = imported, else 1 + ErrorKind), u32 message length
//           (<= 4096), i64 seq_len, i64 bytes, i64 chunks, the message.
//
// Bounds: at most `max_pending` offered imports wait for their connection
// (each holds its reserved rows) and each expires after `ticket_ttl_s`; at
// most `max_connections` connections are served at once and
// `max_connections_per_ip` from one client address (more are closed at
// once; a connection stops counting once it has sent its last frame, and
// those lingering may at most double either count); a connection must
// present its ticket within `hello_timeout_s` of being accepted, and every
// later read and write has an `io_timeout_s`. A
// connection that does not present a live ticket in time is closed after one
// error frame and a linger of at most `hello_timeout_s`. A pusher whose
// connection fails streams over gRPC instead (rpc/migrate.h); DropOffers
// undoes its offer here.
//
// Thread-safety: KvTransferListener's methods are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "node/migration.h"
#include "node/node_core.h"
#include "rpc/options.h"

namespace meshnet::rpc {

struct KvTransferOptions {
  std::string host = "127.0.0.1";  // what to bind (the node's --listen host)
  int port = 0;                    // 0: any free port
  int max_pending = 8;
  int max_connections = 8;
  // A draining node pushes DrainOptions::parallel (4) sessions at once.
  int max_connections_per_ip = 4;
  double ticket_ttl_s = 10.0;
  double hello_timeout_s = 1.0;
  double io_timeout_s = 10.0;
};

struct KvOffer {
  std::string ticket;  // 32 bytes
  int port = 0;
  double ttl_s = 0;
};

class KvTransferListener {
 public:
  // Binds and starts accepting. Error(kUnavailable) when the address cannot
  // be bound. `core` must outlive the listener.
  KvTransferListener(node::NodeCore* core, KvTransferOptions options);
  ~KvTransferListener();  // Stop()
  KvTransferListener(const KvTransferListener&) = delete;
  KvTransferListener& operator=(const KvTransferListener&) = delete;

  int port() const;
  // NodeCore::BeginImport (its errors as they are), then a ticket for it.
  // Error(kResourceExhausted) when max_pending offers wait already.
  KvOffer Offer(node::SessionExportHeader header);
  // Offers waiting for their connection (expired ones are dropped first).
  int64_t pending();
  // Drops the offers waiting for `session_id` (their imports are undone).
  void DropOffers(const std::string& session_id);
  // Connections closed at once because of the connection limits.
  int64_t refused_connections() const;
  // Closes the port and every connection, drops the offers (their imports
  // are undone), joins the threads. Idempotent.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Sends `exporter` (from its first chunk) to `host:port` with `ticket`, and
// returns the bytes of KV sent once the node answers that it imported them.
// Throws Error with the node's reason when it refuses, kUnavailable when the
// connection fails.
int64_t SendKvTransfer(node::SessionExporter& exporter, const std::string& host, int port,
                       const std::string& ticket, const ClientOptions& options);

}  // namespace meshnet::rpc
