#include "registry/record.h"

#include <algorithm>
#include <atomic>
#include <tuple>

#include "util/clock.h"
#include "util/error.h"
#include "util/host_port.h"

namespace meshnet::registry {

bool NodeRecord::SameIdentity(const NodeRecord& o) const {
  return std::tie(address, model_id, architecture, start_layer, end_layer, total_layers,
                  recipe_fingerprint, instance_id, public_key) ==
         std::tie(o.address, o.model_id, o.architecture, o.start_layer, o.end_layer, o.total_layers,
                  o.recipe_fingerprint, o.instance_id, o.public_key);
}

void NodeRecord::Validate() const {
  if (address.empty() || address.size() > 512) {
    ThrowInvalidArgument("node record: address must be 1..512 bytes");
  }
  if (CanonicalHostPort(address) != address) {
    ThrowInvalidArgument("node record: address '" + address + "' is not canonical (" +
                         CanonicalHostPort(address) + ")");
  }
  if (version.size() > 128 || instance_id.size() > 128 || architecture.size() > 128 ||
      recipe_fingerprint.size() > 256 || public_key.size() > kPublicKeyBytes ||
      signature.size() > kSignatureBytes) {
    ThrowInvalidArgument("node record " + address + ": a field is too long");
  }
  if (model_id.empty() || model_id.size() > 128) {
    ThrowInvalidArgument("node record " + address + ": model id must be 1..128 bytes");
  }
  if (model_id.find('/') != std::string::npos || address.find('/') != std::string::npos) {
    ThrowInvalidArgument("node record " + address + ": '/' in the address or model id");
  }
  if (total_layers <= 0 || start_layer < 0 || start_layer > end_layer ||
      end_layer >= total_layers) {
    ThrowInvalidArgument("node record " + address + ": layers " + std::to_string(start_layer) +
                         "-" + std::to_string(end_layer) + " do not fit a model of " +
                         std::to_string(total_layers) + " layers");
  }
  if (kv_budget_bytes < 0 || kv_bytes_free < 0 || sessions_free < 0 || live_sessions < 0 ||
      in_flight_steps < 0) {
    ThrowInvalidArgument("node record " + address + ": negative count");
  }
}

nlohmann::json ToJson(const NodeRecord& r) {
  return {{"address", r.address},
          {"model_id", r.model_id},
          {"architecture", r.architecture},
          {"start_layer", r.start_layer},
          {"end_layer", r.end_layer},
          {"total_layers", r.total_layers},
          {"recipe_fingerprint", r.recipe_fingerprint},
          {"kv_budget_bytes", r.kv_budget_bytes},
          {"kv_bytes_free", r.kv_bytes_free},
          {"sessions_free", r.sessions_free},
          {"live_sessions", r.live_sessions},
          {"in_flight_steps", r.in_flight_steps},
          {"version", r.version},
          {"instance_id", r.instance_id},
          {"draining", r.draining},
          {"public_key", ToHex(r.public_key)},
          {"signed_at_ms", r.signed_at_ms},
          {"signature", ToHex(r.signature)}};
}

NodeRecord RecordFromJson(const nlohmann::json& j) {
  NodeRecord r;
  try {
    r.address = j.at("address").get<std::string>();
    r.model_id = j.at("model_id").get<std::string>();
    r.architecture = j.value("architecture", "");
    r.start_layer = j.at("start_layer").get<int>();
    r.end_layer = j.at("end_layer").get<int>();
    r.total_layers = j.at("total_layers").get<int>();
    r.recipe_fingerprint = j.value("recipe_fingerprint", "");
    r.kv_budget_bytes = j.value("kv_budget_bytes", int64_t{0});
    r.kv_bytes_free = j.value("kv_bytes_free", int64_t{0});
    r.sessions_free = j.value("sessions_free", int64_t{0});
    r.live_sessions = j.value("live_sessions", int64_t{0});
    r.in_flight_steps = j.value("in_flight_steps", int64_t{0});
    r.version = j.value("version", "");
    r.instance_id = j.value("instance_id", "");
    r.draining = j.value("draining", false);
    r.public_key = FromHex(j.value("public_key", ""));
    r.signed_at_ms = j.value("signed_at_ms", int64_t{0});
    r.signature = FromHex(j.value("signature", ""));
  } catch (const nlohmann::json::exception& e) {
    ThrowInvalidArgument(std::string("malformed node record: ") + e.what());
  }
  r.Validate();
  return r;
}

std::string RecordSignedText(const NodeRecord& r) {
  return "meshnet-record-v1\n" + r.address + "\n" + r.model_id + "\n" + r.architecture + "\n" +
         std::to_string(r.start_layer) + "-" + std::to_string(r.end_layer) + "/" +
         std::to_string(r.total_layers) + "\n" + r.recipe_fingerprint + "\n" + r.version + "\n" +
         r.instance_id + "\n" + (r.draining ? "draining" : "serving") + "\n" + r.public_key + "\n" +
         std::to_string(r.signed_at_ms);
}

void SignRecord(const SigningKey& key, NodeRecord* r) {
  static std::atomic<int64_t> last{0};
  const int64_t now = UnixMillis();
  int64_t prev = last.load();
  int64_t ts = std::max(now, prev + 1);
  while (!last.compare_exchange_weak(prev, ts)) ts = std::max(now, prev + 1);
  r->public_key = key.public_key();
  r->signed_at_ms = ts;
  r->signature = key.Sign(RecordSignedText(*r));
}

bool RecordSignatureValid(const NodeRecord& r) {
  return VerifySignature(r.public_key, RecordSignedText(r), r.signature);
}

void RequireSignedRecord(const NodeRecord& r) {
  if (!RecordSignatureValid(r)) {
    throw Error(ErrorKind::kPermissionDenied,
                "node record " + r.address + " is not signed by its node key");
  }
}

void SortRecords(std::vector<NodeRecord>& nodes) {
  std::sort(nodes.begin(), nodes.end(), [](const NodeRecord& a, const NodeRecord& b) {
    return std::tie(a.model_id, a.start_layer, a.address) <
           std::tie(b.model_id, b.start_layer, b.address);
  });
}

}  // namespace meshnet::registry
