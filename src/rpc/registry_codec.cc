#include "rpc/registry_codec.h"

namespace meshnet::rpc {

void EncodeRecord(const registry::NodeRecord& r, pb::RegistryNodeRecord* out) {
  out->set_address(r.address);
  out->set_model_id(r.model_id);
  out->set_architecture(r.architecture);
  out->set_start_layer(r.start_layer);
  out->set_end_layer(r.end_layer);
  out->set_total_layers(r.total_layers);
  out->set_recipe_fingerprint(r.recipe_fingerprint);
  out->set_kv_budget_bytes(r.kv_budget_bytes);
  out->set_kv_bytes_free(r.kv_bytes_free);
  out->set_sessions_free(r.sessions_free);
  out->set_live_sessions(r.live_sessions);
  out->set_in_flight_steps(r.in_flight_steps);
  out->set_version(r.version);
  out->set_instance_id(r.instance_id);
  out->set_draining(r.draining);
  out->set_public_key(r.public_key);
  out->set_signature(r.signature);
  out->set_signed_at_ms(r.signed_at_ms);
}

registry::NodeRecord DecodeRecord(const pb::RegistryNodeRecord& p) {
  registry::NodeRecord r;
  r.address = p.address();
  r.model_id = p.model_id();
  r.architecture = p.architecture();
  r.start_layer = p.start_layer();
  r.end_layer = p.end_layer();
  r.total_layers = p.total_layers();
  r.recipe_fingerprint = p.recipe_fingerprint();
  r.kv_budget_bytes = p.kv_budget_bytes();
  r.kv_bytes_free = p.kv_bytes_free();
  r.sessions_free = p.sessions_free();
  r.live_sessions = p.live_sessions();
  r.in_flight_steps = p.in_flight_steps();
  r.version = p.version();
  r.instance_id = p.instance_id();
  r.draining = p.draining();
  r.public_key = p.public_key();
  r.signature = p.signature();
  r.signed_at_ms = p.signed_at_ms();
  return r;
}

}  // namespace meshnet::rpc
