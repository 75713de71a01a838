#include "rpc/migrate.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include "node/identity.h"
#include "proto/meshnet.grpc.pb.h"
#include "rpc/auth.h"
#include "rpc/channel.h"
#include "rpc/codec.h"
#include "rpc/kv_transfer.h"
#include "rpc/prove.h"
#include "rpc/status.h"
#include "util/error.h"
#include "util/signing_key.h"

namespace meshnet::rpc {

void EncodeExportHeader(const node::SessionExportHeader& h, pb::SessionExportHeader* out) {
  out->set_model_id(h.model_id);
  out->set_architecture(h.architecture);
  out->set_start_layer(h.start_layer);
  out->set_end_layer(h.end_layer);
  out->set_total_layers(h.total_layers);
  out->set_recipe_fingerprint(h.recipe_fingerprint);
  out->set_kv_dtype(ToWireDtype(h.kv_dtype));
  out->set_n_kv_heads(h.n_kv_heads);
  out->set_head_dim(h.head_dim);
  out->set_session_id(h.session_id);
  out->set_secret_sha256(h.secret_sha256);
  out->set_route_epoch(h.route_epoch);
  out->set_seq_len(h.seq_len);
  out->set_positions_per_chunk(h.positions_per_chunk);
  out->set_n_chunks(h.n_chunks);
  out->set_bytes_per_token(h.bytes_per_token);
}

node::SessionExportHeader DecodeExportHeader(const pb::SessionExportHeader& in) {
  node::SessionExportHeader h;
  h.model_id = in.model_id();
  h.architecture = in.architecture();
  h.start_layer = in.start_layer();
  h.end_layer = in.end_layer();
  h.total_layers = in.total_layers();
  h.recipe_fingerprint = in.recipe_fingerprint();
  h.kv_dtype = FromWireKvDtype(in.kv_dtype());
  h.n_kv_heads = in.n_kv_heads();
  h.head_dim = in.head_dim();
  h.session_id = in.session_id();
  h.secret_sha256 = in.secret_sha256();
  h.route_epoch = in.route_epoch();
  h.seq_len = in.seq_len();
  h.positions_per_chunk = in.positions_per_chunk();
  h.n_chunks = in.n_chunks();
  h.bytes_per_token = in.bytes_per_token();
  return h;
}

bool WriteExport(node::SessionExporter& exporter,
                 const std::function<bool(const pb::SessionChunk&)>& write) {
  exporter.Rewind();
  pb::SessionChunk msg;
  EncodeExportHeader(exporter.header(), msg.mutable_header());
  if (!write(msg)) return false;
  node::KvChunk chunk;
  while (exporter.Next(&chunk)) {
    pb::KvChunk* c = msg.mutable_chunk();  // clears the header
    c->set_index(chunk.index);
    c->set_first_position(chunk.first_position);
    c->set_n_positions(chunk.n_positions);
    c->set_data(std::move(chunk.data));
    c->set_crc32c(chunk.crc32c);
    if (!write(msg)) return false;
    chunk.data = std::move(*c->mutable_data());  // reuse the buffer
  }
  const node::ExportTrailer t = exporter.trailer();
  pb::SessionExportTrailer* tr = msg.mutable_trailer();
  tr->set_session_digest(t.session_digest);
  tr->set_total_bytes(t.total_bytes);
  return write(msg);
}

namespace {

// Reads chunks into the importer until the trailer; the stream must hold
// nothing else.
void ReadChunks(node::SessionImporter& imp, const std::function<bool(pb::SessionChunk*)>& read) {
  pb::SessionChunk msg;
  node::KvChunk chunk;
  while (read(&msg)) {
    if (msg.has_chunk()) {
      pb::KvChunk* c = msg.mutable_chunk();
      chunk.index = c->index();
      chunk.first_position = c->first_position();
      chunk.n_positions = c->n_positions();
      chunk.data.swap(*c->mutable_data());  // lent, not copied
      chunk.crc32c = c->crc32c();
      imp.Add(chunk);  // copies into the importer's staging
      chunk.data.swap(*c->mutable_data());
      continue;
    }
    if (msg.has_trailer()) {
      imp.Finish({msg.trailer().session_digest(), msg.trailer().total_bytes()});
      if (read(&msg)) ThrowInvalidArgument("import refused: data after the trailer");
      return;
    }
    ThrowInvalidArgument("import refused: a second header or an empty message");
  }
  ThrowInvalidArgument("import refused: the stream ended before the trailer");
}

}  // namespace

void ServeImport(node::NodeCore& core, const std::function<bool(pb::SessionChunk*)>& read,
                 pb::ImportSessionResponse* out) {
  pb::SessionChunk first;
  std::unique_ptr<node::SessionImporter> imp;
  try {
    if (!read(&first) || !first.has_header()) {
      ThrowInvalidArgument("import refused: the stream must start with a header");
    }
    imp = core.BeginImport(DecodeExportHeader(first.header()));
    ReadChunks(*imp, read);
  } catch (const Error&) {
    if (imp) core.counters().imports_rejected.fetch_add(1, std::memory_order_relaxed);
    throw;
  }
  out->set_seq_len(core.CommitImport(*imp));
  out->set_bytes(imp->bytes());
  out->set_chunks(imp->chunks());
}

void ServeExport(node::NodeCore& core, const pb::ExportSessionRequest& request,
                 const std::function<bool(const pb::SessionChunk&)>& write) {
  node::ValidateSessionKey(request.session_id(), request.session_secret(), request.route_epoch());
  std::unique_ptr<node::SessionExporter> exp =
      core.BeginExport(request.session_id(), &request.session_secret());
  if (exp->header().route_epoch != request.route_epoch()) {
    throw Error(ErrorKind::kStaleEpoch, "the session is at epoch " +
                                            std::to_string(exp->header().route_epoch) + ", not " +
                                            std::to_string(request.route_epoch()));
  }
  if (WriteExport(*exp, write)) {
    core.counters().sessions_exported.fetch_add(1, std::memory_order_relaxed);
  }
}

namespace {

// OfferImport, then the KV over the target's transfer port; nothing when the
// target has no such port (UNIMPLEMENTED: TLS, --kv-transfer-port -1, or an
// older node) or the port does not take the bytes (unreachable, full, cut),
// so that the caller streams over gRPC instead (the target drops the unused
// offer when the stream begins).
std::optional<int64_t> PushOverKvTransfer(node::SessionExporter& exporter,
                                          const std::string& target, pb::MeshNode::Stub& stub,
                                          const ClientOptions& options, const std::string& proof) {
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos || colon == 0 || target.find('/') != std::string::npos) {
    return std::nullopt;  // not host:port (a resolver URI): no host to connect to
  }
  pb::OfferImportRequest req;
  EncodeExportHeader(exporter.header(), req.mutable_header());
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(options.timeout_s));  // the target may wait for admission
  if (!proof.empty()) ctx.AddMetadata(kPeerProofMetadata, proof);
  pb::OfferImportResponse resp;
  const grpc::Status s = stub.OfferImport(&ctx, req, &resp);
  if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) return std::nullopt;
  if (!s.ok()) ThrowForStatus(s, ctx, target, "OfferImport");
  try {
    return SendKvTransfer(exporter, target.substr(0, colon), resp.port(), resp.ticket(), options);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kUnavailable) throw;
    spdlog::warn("event=kv_transfer_fallback to={} message=\"{}\" (streaming over gRPC)", target,
                 e.what());
    return std::nullopt;
  }
}

// The target must be the node it claims and a replica of `self`; its key.
std::string ProveReplica(pb::MeshNode::Stub& stub, const DrainTarget& target,
                         const node::ShardInfo& self, const ClientOptions& options) {
  const ProvenNode p = ProveOn(stub, target.address, options, target.public_key);
  const mesh::ShardInfo& s = p.info.shard;
  if (s.model_id != self.model_id || s.start_layer != self.start_layer ||
      s.end_layer != self.end_layer || s.recipe_fingerprint != self.recipe_fingerprint) {
    throw Error(ErrorKind::kPermissionDenied,
                target.address + " is not a replica of this node's layers " +
                    std::to_string(self.start_layer) + "-" + std::to_string(self.end_layer) +
                    " (model, range or KV recipe differ)");
  }
  return p.public_key;
}

}  // namespace

int64_t PushSession(node::SessionExporter& exporter, const DrainTarget& to,
                    const node::ShardInfo& self, const ClientOptions& options) {
  const std::string& target = to.address;
  auto channel = MakeChannel(target, options);
  // Connect first, within the connect timeout: gRPC fails a call at once on a
  // transient connect error (seen under load on loopback), and the export is
  // consumed once streaming starts, so the stream must open on a ready channel.
  // A dead target still costs only the connect timeout.
  if (!channel->WaitForConnected(DeadlineAfter(options.connect_timeout_s)))
    throw Error(ErrorKind::kUnavailable, target + ": ImportSession: no connection within " +
                                             std::to_string(options.connect_timeout_s) + " s");
  auto stub = pb::MeshNode::NewStub(channel);
  // Proven on this channel (its connection carries the session next); the
  // peer proof names that key, so only that node can use it.
  const std::string proof = PeerProof(options.auth_token, ProveReplica(*stub, to, self, options));
  if (options.kv_transfer && options.tls_ca.empty()) {
    if (std::optional<int64_t> sent = PushOverKvTransfer(exporter, target, *stub, options, proof)) {
      return *sent;
    }
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(options.timeout_s));
  if (!proof.empty()) ctx.AddMetadata(kPeerProofMetadata, proof);
  pb::ImportSessionResponse resp;
  std::unique_ptr<grpc::ClientWriter<pb::SessionChunk>> writer = stub->ImportSession(&ctx, &resp);
  const bool all =
      WriteExport(exporter, [&](const pb::SessionChunk& m) { return writer->Write(m); });
  if (all) writer->WritesDone();
  const grpc::Status s = writer->Finish();
  if (!s.ok()) ThrowForStatus(s, ctx, target, "ImportSession");
  if (!all) throw Error(ErrorKind::kUnavailable, target + ": ImportSession: stream cut short");
  return exporter.trailer().total_bytes;
}

}  // namespace meshnet::rpc
