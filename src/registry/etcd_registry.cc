#include "registry/etcd_registry.h"

#include <httplib.h>
#include <openssl/evp.h>

#include <charconv>
#include <chrono>
#include <cmath>

#include "util/error.h"

namespace meshnet::registry {

namespace {

std::string B64(const std::string& s) {
  std::string out(4 * ((s.size() + 2) / 3), '\0');
  const int n =
      EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  out.resize(n);
  return out;
}

std::string UnB64(const std::string& s) {
  if (s.empty()) return "";
  std::string out(3 * s.size() / 4 + 3, '\0');
  const int n =
      EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  if (n < 0) throw Error(ErrorKind::kInvalidArgument, "etcd answered malformed base64");
  size_t pad = 0;  // EVP_DecodeBlock counts '=' padding as zero bytes
  while (pad < 2 && pad < s.size() && s[s.size() - 1 - pad] == '=') ++pad;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

// The gateway writes int64 as JSON strings.
int64_t Int(const nlohmann::json& j, const char* field) {
  if (!j.contains(field)) return 0;
  const auto& v = j.at(field);
  if (v.is_number_integer()) return v.get<int64_t>();
  if (!v.is_string()) return 0;
  const std::string s = v.get<std::string>();
  int64_t out = 0;
  std::from_chars(s.data(), s.data() + s.size(), out);
  return out;
}

// The first key after every key that starts with `prefix`.
std::string RangeEnd(std::string prefix) {
  prefix.back() = static_cast<char>(prefix.back() + 1);
  return prefix;
}

}  // namespace

bool IsEtcdUrl(const std::string& spec) { return spec.rfind("etcd://", 0) == 0; }

EtcdAddress ParseEtcdUrl(const std::string& url) {
  auto bad = [&](const std::string& why) {
    ThrowInvalidArgument("invalid etcd registry '" + url + "': " + why +
                         " (expected etcd://HOST:PORT/prefix)");
  };
  if (!IsEtcdUrl(url)) bad("no etcd:// scheme");
  const std::string rest = url.substr(7);
  const size_t slash = rest.find('/');
  const std::string hostport = rest.substr(0, slash);
  const size_t colon = hostport.rfind(':');
  if (colon == std::string::npos || colon == 0) bad("no host:port");
  EtcdAddress a;
  a.host = hostport.substr(0, colon);
  const std::string port = hostport.substr(colon + 1);
  auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), a.port);
  if (ec != std::errc() || p != port.data() + port.size() || a.port < 1 || a.port > 65535) {
    bad("port must be 1..65535");
  }
  if (slash != std::string::npos) {
    std::string prefix = rest.substr(slash);
    while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
    if (prefix != "/") a.prefix = prefix;
  }
  return a;
}

EtcdRegistry::EtcdRegistry(EtcdAddress address, double timeout_s)
    : address_(std::move(address)), timeout_s_(timeout_s) {}

std::string EtcdRegistry::name() const {
  return "etcd://" + address_.host + ":" + std::to_string(address_.port) + address_.prefix;
}

std::string EtcdRegistry::Key(const NodeRecord& r) const {
  return address_.prefix + "/nodes/" + r.model_id + "/" + r.address;
}

nlohmann::json EtcdRegistry::Call(const std::string& path, const nlohmann::json& body) const {
  httplib::Client cli(address_.host, address_.port);
  const auto t = std::chrono::duration<double>(timeout_s_);
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(t).count();
  cli.set_connection_timeout(us / 1000000, us % 1000000);
  cli.set_read_timeout(us / 1000000, us % 1000000);
  cli.set_write_timeout(us / 1000000, us % 1000000);
  auto res = cli.Post(path, body.dump(), "application/json");
  if (!res) {
    throw Error(ErrorKind::kUnavailable, "etcd " + name() + " unreachable (" + path + ": " +
                                             httplib::to_string(res.error()) + ")");
  }
  nlohmann::json j = nlohmann::json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    throw Error(ErrorKind::kUnavailable,
                "etcd " + path + ": not JSON (HTTP " + std::to_string(res->status) + ")");
  }
  if (j.contains("error") || res->status != 200) {
    const std::string msg = j.value("message", j.value("error", std::string("HTTP error")));
    // 14: UNAVAILABLE (no leader, e.g. right after a restart).
    throw Error(Int(j, "code") == 14 ? ErrorKind::kUnavailable : ErrorKind::kInvalidArgument,
                "etcd " + path + ": " + msg);
  }
  return j;
}

void EtcdRegistry::Put(const std::string& key, const NodeRecord& r, LeaseId lease) const {
  Call("/v3/kv/put",
       {{"key", B64(key)}, {"value", B64(ToJson(r).dump())}, {"lease", std::to_string(lease)}});
}

LeaseId EtcdRegistry::Announce(const NodeRecord& record, double ttl_s) {
  record.Validate();
  if (!std::isfinite(ttl_s) || ttl_s <= 0 || ttl_s > 86400) {
    ThrowInvalidArgument("lease TTL must be in (0, 86400] seconds");
  }
  const std::string key = Key(record);
  const nlohmann::json old = Call("/v3/kv/range", {{"key", B64(key)}});
  const auto ttl = static_cast<int64_t>(std::ceil(ttl_s));
  const LeaseId lease = Int(Call("/v3/lease/grant", {{"TTL", ttl}}), "ID");
  Put(key, record, lease);
  for (const auto& kv : old.value("kvs", nlohmann::json::array())) {
    const int64_t prev = Int(kv, "lease");
    if (prev != 0 && prev != lease) Withdraw(prev);  // the key now has the new lease
  }
  return lease;
}

bool EtcdRegistry::Renew(LeaseId lease, const NodeRecord& record) {
  record.Validate();
  const nlohmann::json live =
      Call("/v3/lease/timetolive", {{"ID", std::to_string(lease)}, {"keys", true}});
  if (Int(live, "TTL") <= 0) return false;
  const std::string key = Key(record);
  const auto keys = live.value("keys", nlohmann::json::array());
  if (keys.size() != 1 || UnB64(keys[0].get<std::string>()) != key) {
    throw Error(ErrorKind::kPermissionDenied,
                "lease " + std::to_string(lease) +
                    " holds another announcement; a renewal may not change what the node serves");
  }
  const nlohmann::json held = Call("/v3/kv/range", {{"key", B64(key)}});
  const auto kvs = held.value("kvs", nlohmann::json::array());
  if (kvs.empty()) return false;
  const NodeRecord prev = RecordFromJson(nlohmann::json::parse(UnB64(kvs[0].value("value", ""))));
  if (!prev.SameIdentity(record)) {
    throw Error(ErrorKind::kPermissionDenied,
                "a renewal may not change what " + record.address + " serves");
  }
  const nlohmann::json ka = Call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}});
  if (Int(ka.value("result", nlohmann::json::object()), "TTL") <= 0) return false;
  NodeRecord next = record;
  next.draining = record.draining || prev.draining;  // sticky until SetDraining(false)
  Put(key, next, lease);
  return true;
}

void EtcdRegistry::Withdraw(LeaseId lease) {
  // The gateway sends an error answer (here: "lease not found") chunked with
  // HTTP trailers, which cpp-httplib 0.11 reads as a broken response: ask
  // whether the lease lives before revoking it.
  const nlohmann::json live = Call("/v3/lease/timetolive", {{"ID", std::to_string(lease)}});
  if (Int(live, "TTL") <= 0) return;
  Call("/v3/lease/revoke", {{"ID", std::to_string(lease)}});
}

Snapshot EtcdRegistry::List(const std::string& model_id) {
  const std::string prefix = address_.prefix + "/nodes/" + (model_id.empty() ? "" : model_id + "/");
  const nlohmann::json j =
      Call("/v3/kv/range", {{"key", B64(prefix)}, {"range_end", B64(RangeEnd(prefix))}});
  Snapshot s;
  s.revision = Int(j.value("header", nlohmann::json::object()), "revision");
  for (const auto& kv : j.value("kvs", nlohmann::json::array())) {
    try {
      s.nodes.push_back(RecordFromJson(nlohmann::json::parse(UnB64(kv.value("value", "")))));
    } catch (const std::exception&) {
      // A foreign or corrupt value under our prefix: not a node.
    }
  }
  SortRecords(s.nodes);
  return s;
}

bool EtcdRegistry::SetDraining(const std::string& address, bool draining) {
  const std::string prefix = address_.prefix + "/nodes/";
  const nlohmann::json j =
      Call("/v3/kv/range", {{"key", B64(prefix)}, {"range_end", B64(RangeEnd(prefix))}});
  for (const auto& kv : j.value("kvs", nlohmann::json::array())) {
    NodeRecord r;
    try {
      r = RecordFromJson(nlohmann::json::parse(UnB64(kv.value("value", ""))));
    } catch (const std::exception&) {
      continue;
    }
    if (r.address != address) continue;
    r.draining = draining;
    Put(UnB64(kv.value("key", "")), r, Int(kv, "lease"));
    return true;
  }
  return false;
}

int64_t EtcdRegistry::WaitForChange(int64_t since, double timeout_s) {
  // A watch from since+1 on the nodes prefix: the gateway streams one JSON
  // object per line; the first is the "created" answer, then events. The read
  // timeout bounds the wait; a line with events (or a compaction) ends it.
  const std::string prefix = address_.prefix + "/nodes/";
  nlohmann::json req = {{"create_request",
                         {{"key", B64(prefix)},
                          {"range_end", B64(RangeEnd(prefix))},
                          {"start_revision", std::to_string(since + 1)}}}};
  httplib::Client cli(address_.host, address_.port);
  const auto us = static_cast<int64_t>(std::max(0.001, timeout_s) * 1e6);
  cli.set_connection_timeout(static_cast<time_t>(std::min(timeout_s_, 5.0)), 0);
  cli.set_read_timeout(us / 1000000, us % 1000000);
  std::string buffer;
  int64_t seen = since;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  httplib::Request r;
  r.method = "POST";
  r.path = "/v3/watch";
  r.body = req.dump();
  r.set_header("Content-Type", "application/json");
  r.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buffer.append(data, n);
    for (size_t eol; (eol = buffer.find('\n')) != std::string::npos;) {
      const auto line = nlohmann::json::parse(buffer.substr(0, eol), nullptr, false);
      buffer.erase(0, eol + 1);
      if (line.is_discarded()) continue;
      const auto result = line.value("result", nlohmann::json::object());
      const int64_t rev = Int(result.value("header", nlohmann::json::object()), "revision");
      if (result.contains("events") || Int(result, "compact_revision") > 0 ||
          result.contains("canceled")) {
        seen = std::max(seen, std::max(rev, since + 1));
        return false;  // stop reading: something changed
      }
    }
    return std::chrono::steady_clock::now() < deadline;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  cli.send(r, res, err);
  if (seen == since && err != httplib::Error::Success && err != httplib::Error::Read &&
      err != httplib::Error::Canceled) {
    // Unreachable etcd: waiting is all a caller can do, but not in a spin.
    if (std::chrono::steady_clock::now() < deadline) {
      throw Error(ErrorKind::kUnavailable,
                  "etcd " + name() + " unreachable (" + httplib::to_string(err) + ")");
    }
  }
  return seen;
}

}  // namespace meshnet::registry
