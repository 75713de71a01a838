#include "registry/etcd_registry.h"

#include <httplib.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <signal.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <fstream>

#include "util/clock.h"
#include "util/error.h"
#include "util/mutex.h"

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

// cpp-httplib writes TLS records with OpenSSL's socket BIO, i.e. write(2)
// without MSG_NOSIGNAL: an etcd that hangs up (e.g. refusing our client
// certificate after a TLS 1.3 handshake) would raise SIGPIPE and kill the
// process. For the duration of one call this thread blocks SIGPIPE, and a
// SIGPIPE the call raised is consumed before the mask is restored; the
// failed write is reported as an error. Thread-local, so other threads' (and
// the program's) disposition of SIGPIPE is untouched.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~ScopedSigpipeBlock() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{0, 0};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

void SetTimeouts(httplib::ClientImpl& cli, double connect_s, double read_s) {
  auto us = [](double s) {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(s))
        .count();
  };
  cli.set_connection_timeout(us(connect_s) / 1000000, us(connect_s) % 1000000);
  cli.set_read_timeout(us(read_s) / 1000000, us(read_s) % 1000000);
  cli.set_write_timeout(us(connect_s) / 1000000, us(connect_s) % 1000000);
}

void RequireReadable(const std::string& path, const char* what) {
  if (path.empty()) return;
  std::ifstream in(path);
  if (!in || in.peek() == std::ifstream::traits_type::eof()) {
    ThrowInvalidArgument(std::string("etcd TLS: cannot read the ") + what + " '" + path + "'");
  }
}

// The kind of an error answer: its gRPC `code` and `message`.
ErrorKind KindOfAnswer(int64_t code, const std::string& msg) {
  // 14 UNAVAILABLE (no leader, e.g. right after a restart), 4 DEADLINE_EXCEEDED, 1 CANCELED.
  if (code == 14 || code == 4 || code == 1) return ErrorKind::kUnavailable;
  // 7 PERMISSION_DENIED, 16 UNAUTHENTICATED; a bad password or no user is 3.
  if (code == 7 || code == 16 || msg.find("authentication failed") != std::string::npos ||
      msg.find("user name is empty") != std::string::npos) {
    return ErrorKind::kPermissionDenied;
  }
  return ErrorKind::kInvalidArgument;
}

// Whether `r` was signed within the lease TTL cap (plus clock skew) of `now_ms`.
bool SignedLately(const NodeRecord& r, int64_t now_ms) {
  const auto max_age_ms = static_cast<int64_t>(kMaxLeaseTtlS * 1000) + kListClockSkewMs;
  return r.signed_at_ms >= now_ms - max_age_ms && r.signed_at_ms <= now_ms + kListClockSkewMs;
}

// The first key after every key that starts with `prefix`.
std::string RangeEnd(std::string prefix) {
  prefix.back() = static_cast<char>(prefix.back() + 1);
  return prefix;
}

}  // namespace

bool IsEtcdUrl(const std::string& spec) {
  return spec.rfind("etcd://", 0) == 0 || spec.rfind("etcds://", 0) == 0;
}

EtcdAddress ParseEtcdUrl(const std::string& url) {
  auto bad = [&](const std::string& why) {
    ThrowInvalidArgument("invalid etcd registry '" + url + "': " + why +
                         " (expected etcd://HOST:PORT/prefix or etcds://HOST:PORT/prefix)");
  };
  if (!IsEtcdUrl(url)) bad("no etcd:// or etcds:// scheme");
  const bool tls = url.rfind("etcds://", 0) == 0;
  const std::string rest = url.substr(tls ? 8 : 7);
  const size_t slash = rest.find('/');
  const std::string hostport = rest.substr(0, slash);
  const size_t colon = hostport.rfind(':');
  if (colon == std::string::npos || colon == 0) bad("no host:port");
  EtcdAddress a;
  a.tls = tls;
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

void EtcdSecurity::Validate(const EtcdAddress& address) const {
  if (user.empty() && !password.empty()) {
    ThrowInvalidArgument("etcd auth: a password without a user");
  }
  if (!address.tls && has_tls_files()) {
    ThrowInvalidArgument("etcd TLS files given for a plain etcd://" + address.host +
                         " registry: write etcds:// to reach etcd over TLS");
  }
  if (cert_file.empty() != key_file.empty()) {
    ThrowInvalidArgument("etcd TLS: the client certificate and its key go together");
  }
  RequireReadable(ca_file, "CA file");
  RequireReadable(cert_file, "client certificate");
  RequireReadable(key_file, "client key");
}

EtcdRegistry::EtcdRegistry(EtcdAddress address, double timeout_s, EtcdSecurity security)
    : address_(std::move(address)), timeout_s_(timeout_s), sec_(std::move(security)) {
  sec_.Validate(address_);
  if (address_.tls) Client();  // a certificate and key that do not load fail here, not per call
}

std::string EtcdRegistry::name() const {
  return std::string(address_.tls ? "etcds://" : "etcd://") + address_.host + ":" +
         std::to_string(address_.port) + address_.prefix;
}

std::unique_ptr<httplib::ClientImpl> EtcdRegistry::Client() const {
  if (!address_.tls) return std::make_unique<httplib::ClientImpl>(address_.host, address_.port);
  auto cli = std::make_unique<httplib::SSLClient>(address_.host, address_.port, sec_.cert_file,
                                                  sec_.key_file);
  if (!cli->is_valid()) {  // the files were readable, but not a certificate and its key
    ThrowInvalidArgument("etcd TLS: '" + sec_.cert_file + "' and '" + sec_.key_file +
                         "' are not a PEM certificate and its private key");
  }
  if (!sec_.ca_file.empty()) cli->set_ca_cert_path(sec_.ca_file);
  cli->enable_server_certificate_verification(true);  // the default, said out loud
  return cli;
}

Error EtcdRegistry::Failure(const std::string& path, httplib::Error err,
                            const httplib::ClientImpl& cli) const {
  const std::string where = "etcd " + name() + " (" + path + "): ";
  if (err == httplib::Error::SSLServerVerification) {
    const long v = static_cast<const httplib::SSLClient&>(cli).get_openssl_verify_result();
    const std::string why = v != X509_V_OK ? X509_verify_cert_error_string(v)
                                           : "its certificate does not name " + address_.host;
    return Error(ErrorKind::kPermissionDenied,
                 where + "server certificate not trusted: " + why +
                     (sec_.ca_file.empty() ? " (no CA file given: the system CAs were used)"
                                           : " (CA file '" + sec_.ca_file + "')"));
  }
  if (err == httplib::Error::SSLLoadingCerts) {
    return Error(ErrorKind::kInvalidArgument,
                 where + "cannot load the CA file '" + sec_.ca_file + "' (PEM expected)");
  }
  if (err == httplib::Error::SSLConnection) {
    return Error(ErrorKind::kUnavailable,
                 where +
                     "TLS handshake failed (is it an https endpoint? does it require a "
                     "client certificate?)");
  }
  std::string hint;
  if (err == httplib::Error::Read || err == httplib::Error::Write) {
    if (!address_.tls) hint = "; if etcd serves TLS, write etcds://";
    if (address_.tls && sec_.cert_file.empty()) {
      hint = "; etcd may require a client certificate, and none was given";
    }
  }
  return Error(ErrorKind::kUnavailable,
               where + "unreachable (" + httplib::to_string(err) + ")" + hint);
}

std::string EtcdRegistry::Key(const NodeRecord& r) const {
  return address_.prefix + "/nodes/" + r.model_id + "/" + r.address;
}

nlohmann::json EtcdRegistry::Post(const std::string& path, const nlohmann::json& body,
                                  const std::string& token) const {
  const auto cli = Client();
  SetTimeouts(*cli, timeout_s_, timeout_s_);
  // The body is collected by hand: the gateway sends error answers chunked
  // with HTTP trailers, which cpp-httplib 0.11 reports as a broken read after
  // it has handed over the (complete) JSON.
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!token.empty()) req.set_header("Authorization", token);
  std::string answer;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    answer.append(data, n);
    return answer.size() <= (64u << 20);  // bounded: no registry answer is this big
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  {
    ScopedSigpipeBlock no_sigpipe;
    cli->send(req, res, err);
  }
  nlohmann::json j = nlohmann::json::parse(answer, nullptr, false);
  const bool error_answer = !j.is_discarded() && j.is_object() && j.contains("error");
  if (err != httplib::Error::Success && !(err == httplib::Error::Read && error_answer)) {
    throw Failure(path, err, *cli);
  }
  if (j.is_discarded() || !j.is_object()) {
    throw Error(ErrorKind::kUnavailable,
                "etcd " + path + ": not JSON (HTTP " + std::to_string(res.status) + ")");
  }
  if (error_answer || res.status != 200) {
    const std::string msg = j.value("message", j.value("error", std::string("HTTP error")));
    const bool no_user = msg.find("user name is empty") != std::string::npos;
    throw Error(KindOfAnswer(Int(j, "code"), msg),
                "etcd " + name() + " (" + path + "): " + msg +
                    (no_user ? " (etcd has auth enabled and no etcd user was given)" : ""));
  }
  return j;
}

std::string EtcdRegistry::Token(bool renew) const {
  if (sec_.user.empty()) return "";
  {
    MutexLock lock(&mu_);
    if (!renew && !token_.empty()) return token_;
  }
  const nlohmann::json j =
      Post("/v3/auth/authenticate", {{"name", sec_.user}, {"password", sec_.password}}, "");
  const std::string token = j.value("token", "");
  if (token.empty()) {
    throw Error(ErrorKind::kPermissionDenied,
                "etcd " + name() + ": no auth token for user '" + sec_.user + "'");
  }
  MutexLock lock(&mu_);
  token_ = token;
  return token;
}

nlohmann::json EtcdRegistry::Call(const std::string& path, const nlohmann::json& body) const {
  try {
    return Post(path, body, Token(false));
  } catch (const Error& e) {
    // etcd forgets tokens (after --auth-token-ttl idle, and on a restart):
    // authenticate again, once.
    if (sec_.user.empty() ||
        std::string(e.what()).find("invalid auth token") == std::string::npos) {
      throw;
    }
  }
  return Post(path, body, Token(true));
}

void EtcdRegistry::Put(const std::string& key, const NodeRecord& r, LeaseId lease) const {
  Call("/v3/kv/put",
       {{"key", B64(key)}, {"value", B64(ToJson(r).dump())}, {"lease", std::to_string(lease)}});
}

Lease EtcdRegistry::Announce(const NodeRecord& record, double ttl_s) {
  record.Validate();
  if (!std::isfinite(ttl_s) || ttl_s <= 0 || ttl_s > 86400) {
    ThrowInvalidArgument("lease TTL must be in (0, 86400] seconds");
  }
  RequireSignedRecord(record);
  const std::string key = Key(record);
  const nlohmann::json old = Call("/v3/kv/range", {{"key", B64(key)}});
  const auto ttl = static_cast<int64_t>(std::ceil(std::min(ttl_s, kMaxLeaseTtlS)));
  const LeaseId lease = Int(Call("/v3/lease/grant", {{"TTL", ttl}}), "ID");
  Put(key, record, lease);
  for (const auto& kv : old.value("kvs", nlohmann::json::array())) {
    const int64_t prev = Int(kv, "lease");
    if (prev != 0 && prev != lease) Revoke(prev);  // the key now has the new lease
  }
  // One record per node key: the same node announced under another address
  // before (its older records go with their leases).
  const std::string model_prefix = address_.prefix + "/nodes/" + record.model_id + "/";
  const nlohmann::json same_model = Call(
      "/v3/kv/range", {{"key", B64(model_prefix)}, {"range_end", B64(RangeEnd(model_prefix))}});
  for (const auto& kv : same_model.value("kvs", nlohmann::json::array())) {
    try {
      const NodeRecord r = RecordFromJson(nlohmann::json::parse(UnB64(kv.value("value", ""))));
      const int64_t prev = Int(kv, "lease");
      if (r.public_key == record.public_key && r.address != record.address && prev != 0) {
        Revoke(prev);
      }
    } catch (const std::exception&) {
      // not a record of ours
    }
  }
  return Lease{lease, "", static_cast<double>(ttl)};
}

bool EtcdRegistry::Renew(const Lease& held_lease, const NodeRecord& record) {
  const LeaseId lease = held_lease.id;
  record.Validate();
  RequireSignedRecord(record);
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
  // A renewal is newer than the node's own record it replaces (what another
  // writer put there proves nothing).
  if (RecordSignatureValid(prev) && record.signed_at_ms <= prev.signed_at_ms) {
    throw Error(ErrorKind::kPermissionDenied,
                "renewal of " + record.address + " refused: not newer than the held record");
  }
  const nlohmann::json ka = Call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}});
  if (Int(ka.value("result", nlohmann::json::object()), "TTL") <= 0) return false;
  Put(key, record, lease);
  return true;
}

void EtcdRegistry::Withdraw(const Lease& lease) { Revoke(lease.id); }

void EtcdRegistry::Revoke(LeaseId lease) const {
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
  const int64_t now_ms = UnixMillis();
  for (const auto& kv : j.value("kvs", nlohmann::json::array())) {
    try {
      NodeRecord r = RecordFromJson(nlohmann::json::parse(UnB64(kv.value("value", ""))));
      // Signed by its node key, under its own key: anything else was not
      // written by the node it names (etcd lets every writer write anything).
      // Under a lease and signed lately: an old record of a node, put back by
      // a writer (with no lease, or a lease it keeps alive), is not a live node.
      if (RecordSignatureValid(r) && UnB64(kv.value("key", "")) == Key(r) &&
          Int(kv, "lease") != 0 && SignedLately(r, now_ms)) {
        s.nodes.push_back(std::move(r));
      }
    } catch (const std::exception&) {
      // A foreign or corrupt value under our prefix: not a node.
    }
  }
  SortRecords(s.nodes);
  return s;
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
  const auto cli = Client();
  const auto us = static_cast<int64_t>(std::max(0.001, timeout_s) * 1e6);
  SetTimeouts(*cli, std::min(timeout_s_, 5.0), us / 1e6);
  std::string buffer;
  int64_t seen = since;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  httplib::Request r;
  r.method = "POST";
  r.path = "/v3/watch";
  r.body = req.dump();
  r.set_header("Content-Type", "application/json");
  const std::string token = Token(false);
  if (!token.empty()) r.set_header("Authorization", token);
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
  {
    ScopedSigpipeBlock no_sigpipe;
    cli->send(r, res, err);
  }
  if (seen == since && err != httplib::Error::Success && err != httplib::Error::Read &&
      err != httplib::Error::Canceled) {
    // Unreachable etcd: waiting is all a caller can do, but not in a spin.
    if (std::chrono::steady_clock::now() < deadline) throw Failure("/v3/watch", err, *cli);
  }
  return seen;
}

}  // namespace meshnet::registry
