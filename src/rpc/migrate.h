// Session migration on the wire (node/migration.h): the SessionChunk codec,
// the node side of ExportSession / ImportSession, and the client that pushes
// an export to another node's ImportSession. Internal to rpc/ (takes protobuf
// and gRPC types); rpc/drain.h is the public face.
//
// Thread-safety: pure functions; each call uses its own stream.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "node/migration.h"
#include "node/node_core.h"
#include "proto/meshnet.pb.h"
#include "rpc/drain.h"
#include "rpc/options.h"

namespace meshnet::rpc {

namespace pb = ::meshnet::v1;

// The channel every client of this library uses (remote.cc).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const ClientOptions& o);

void EncodeExportHeader(const node::SessionExportHeader& h, pb::SessionExportHeader* out);
// kInvalidArgument for an unknown dtype; everything else is checked by
// node::SessionImporter.
node::SessionExportHeader DecodeExportHeader(const pb::SessionExportHeader& in);

// Writes header, chunks and trailer of `exporter` from its first chunk;
// stops early (returns false) when `write` does.
bool WriteExport(node::SessionExporter& exporter,
                 const std::function<bool(const pb::SessionChunk&)>& write);

// Node side of ImportSession: reads the stream with `read` (false at its
// end), verifies everything, then loads it into `core`. Throws
// meshnet::Error (counted as a rejected import); nothing is loaded then.
void ServeImport(node::NodeCore& core, const std::function<bool(pb::SessionChunk*)>& read,
                 pb::ImportSessionResponse* out);

// Node side of ExportSession for the session's owner.
void ServeExport(node::NodeCore& core, const pb::ExportSessionRequest& request,
                 const std::function<bool(const pb::SessionChunk&)>& write);

// Sends `exporter` to the node at `target`: first has it prove itself on
// the connection (rpc/prove.h; the key target.public_key when given, the
// model, range and recipe of `self`), then offers it over the target's KV
// transfer port, falling back to the ImportSession stream when the target has
// no port or the port fails; every call carries a peer proof, never
// options.auth_token itself. Throws meshnet::Error with the target's reason
// when it refuses (kPermissionDenied when it fails its proof). Returns the
// bytes of KV sent.
int64_t PushSession(node::SessionExporter& exporter, const DrainTarget& target,
                    const node::ShardInfo& self, const ClientOptions& options);

}  // namespace meshnet::rpc
