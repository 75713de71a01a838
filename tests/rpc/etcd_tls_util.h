// Test helper: the throwaway PKI of an etcd with TLS (registry/etcd_test_util.h
// runs it). Here, not in src/registry/, because it builds on rpc/test_util.h
// (a layer above registry/).
#pragma once

#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

#include "registry/etcd_test_util.h"
#include "rpc/test_util.h"

namespace meshnet::registry::testing {

// A throwaway PKI (rpc::testing::MakeTestPki: CA, client certificate, an
// unrelated CA) and, signed by the same CA, the server certificate etcd needs
// (IP SAN 127.0.0.1; serverAuth and clientAuth). Throws if openssl fails.
inline EtcdServerTls MakeEtcdPki(const rpc::testing::ScratchDir& dir, rpc::testing::TestPki* pki) {
  *pki = rpc::testing::MakeTestPki(dir);
  const std::string d = dir.path().string();
  std::ofstream(d + "/etcd.ext") << "subjectAltName=IP:127.0.0.1\n"
                                 << "extendedKeyUsage=serverAuth,clientAuth\n";
  const std::string sh = "cd '" + d +
                         "' && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key "
                         "-CAcreateserial -days 1 -extfile etcd.ext -out etcd.pem >/dev/null 2>&1";
  if (std::system(sh.c_str()) != 0) throw std::runtime_error("openssl failed: " + sh);
  return {pki->ca_cert, d + "/etcd.pem", pki->server_key, pki->client_cert, pki->client_key};
}

}  // namespace meshnet::registry::testing
