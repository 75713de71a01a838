#include "http/tls_context.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <filesystem>

#include "util/error.h"

namespace meshnet::http {

std::unique_ptr<TlsContext> TlsContext::Load(const std::string& cert_file,
                                             const std::string& key_file) {
  for (const std::string& f : {cert_file, key_file}) {
    if (!std::filesystem::is_regular_file(f)) ThrowInvalidArgument("cannot read TLS file " + f);
  }
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) ThrowInvalidArgument("OpenSSL cannot make a TLS context");
  std::unique_ptr<TlsContext> out(new TlsContext(ctx));
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  // Writes may complete partially and be retried from another buffer address.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_use_certificate_chain_file(ctx, cert_file.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    ERR_clear_error();
    ThrowInvalidArgument("the TLS certificate or key is not valid PEM, or they do not match (" +
                         cert_file + ", " + key_file + ")");
  }
  return out;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

SSL* TlsContext::NewSession(int fd) const {
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr) return nullptr;
  if (SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    return nullptr;
  }
  SSL_set_accept_state(ssl);
  return ssl;
}

}  // namespace meshnet::http
