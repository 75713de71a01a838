// registry::NodeRecord <-> pb::RegistryNodeRecord. Internal to rpc/.
//
// Thread-safety: pure functions.
#pragma once

#include "proto/meshnet.pb.h"
#include "registry/record.h"
#include "rpc/codec.h"

namespace meshnet::rpc {

void EncodeRecord(const registry::NodeRecord& r, pb::RegistryNodeRecord* out);
registry::NodeRecord DecodeRecord(const pb::RegistryNodeRecord& p);

}  // namespace meshnet::rpc
