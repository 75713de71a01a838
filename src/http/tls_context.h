// The server side of TLS for the hardened HTTP server: one SSL_CTX loaded
// from a PEM certificate chain and key (TLS 1.2 or later, no compression),
// and non-blocking sessions on accepted sockets.
//
// Thread-safety: immutable after Load; NewSession from any thread.
#pragma once

#include <memory>
#include <string>

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace meshnet::http {

class TlsContext {
 public:
  // Throws Error(kInvalidArgument) naming the file that is unreadable or not
  // a valid PEM certificate chain / matching private key.
  static std::unique_ptr<TlsContext> Load(const std::string& cert_file,
                                          const std::string& key_file);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // A server session on `fd` (the caller drives SSL_accept); nullptr when
  // OpenSSL cannot allocate one.
  SSL* NewSession(int fd) const;

 private:
  explicit TlsContext(SSL_CTX* ctx) : ctx_(ctx) {}
  SSL_CTX* ctx_;
};

}  // namespace meshnet::http
