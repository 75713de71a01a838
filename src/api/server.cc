#include "api/server.h"

#include <httplib.h>
#include <openssl/crypto.h>
#include <sys/socket.h>

#include <filesystem>
#include <utility>

#include "api/api_error.h"
#include "api/chat_html.h"  // generated from chat.html (CMake)
#include "api/engine.h"
#include "api/handlers.h"
#include "util/error.h"

namespace meshnet::api {
namespace {

using nlohmann::json;

// Constant-time comparison of the Bearer token with the key.
bool Authorized(const httplib::Request& req, const std::string& key) {
  if (key.empty()) return true;
  const std::string header = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  if (header.size() != prefix.size() + key.size() || header.compare(0, prefix.size(), prefix) != 0)
    return false;
  return CRYPTO_memcmp(header.data() + prefix.size(), key.data(), key.size()) == 0;
}

void SetError(httplib::Response& res, const ApiError& e) {
  if (e.status() == 429) res.set_header("Retry-After", "1");
  if (e.status() == 401) res.set_header("WWW-Authenticate", "Bearer");
  SetJson(res, e.ToJson(), e.status());
}

}  // namespace

ApiServer::ApiServer(Engine* engine, ServerOptions options)
    : engine_(engine), options_(std::move(options)) {
  if (options_.tls_cert.empty() != options_.tls_key.empty()) {
    ThrowInvalidArgument("--tls-cert and --tls-key go together");
  }
  if (!options_.tls_cert.empty()) {
    for (const auto& f : {options_.tls_cert, options_.tls_key}) {
      if (!std::filesystem::is_regular_file(f)) ThrowInvalidArgument("cannot read TLS file " + f);
    }
    auto ssl =
        std::make_unique<httplib::SSLServer>(options_.tls_cert.c_str(), options_.tls_key.c_str());
    if (!ssl->is_valid()) {
      ThrowInvalidArgument("the TLS certificate or key is not valid PEM (" + options_.tls_cert +
                           ", " + options_.tls_key + ")");
    }
    http_ = std::move(ssl);
  } else {
    http_ = std::make_unique<httplib::Server>();
  }
  const int threads = options_.worker_threads;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_keep_alive_max_count(1000);
  // Tokens go out as small writes; Nagle would hold each one back for the
  // previous one's ACK.
  http_->set_tcp_nodelay(true);
  // Remember the listening socket: Bind() deepens its accept backlog.
  http_->set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd_ = sock;
  });
  Routes();
}

ApiServer::~ApiServer() = default;

namespace {

using Req = const httplib::Request&;
using Res = httplib::Response&;

// Wraps a handler: auth, ApiError -> error body, metrics by endpoint+status.
template <typename Fn>
httplib::Server::Handler Wrap(Engine* engine, const std::string* api_key, std::string endpoint,
                              bool needs_key, Fn fn) {
  return [=](Req req, Res res) {
    try {
      if (needs_key && !Authorized(req, *api_key)) {
        throw ApiError(401, "a valid API key is required (Authorization: Bearer KEY)",
                       "invalid_request_error", "", "invalid_api_key");
      }
      fn(req, res);
    } catch (const ApiError& e) {
      SetError(res, e);
    } catch (const Error& e) {
      // Typed errors reaching here come from the request (e.g. a tokenizer
      // refusing input); anything else is ours.
      const bool bad_input = e.kind() == ErrorKind::kInvalidArgument;
      SetError(res, ApiError(bad_input ? 400 : 500, e.what(),
                             bad_input ? "invalid_request_error" : "server_error"));
    } catch (const std::exception& e) {
      SetError(res, ApiError(500, std::string("internal error: ") + e.what(), "server_error"));
    }
    engine->metrics().CountRequest(endpoint, res.status);
  };
}

json ModelObject(const Engine& engine) {
  return {{"id", engine.options().model_name},
          {"object", "model"},
          {"created", 0},
          {"owned_by", "meshnet"}};
}

// Every failure httplib produces itself (unknown path 404, body too large
// 413, malformed HTTP 400) gets an OpenAI-style body too. Handler responses
// already have a body and pass through.
void ErrorBody(Engine* engine, Req req, Res res) {
  if (!res.body.empty()) return;
  std::string message = "request failed with HTTP status " + std::to_string(res.status);
  std::string code;
  if (res.status == 404) {
    message = "no route for " + req.method + " " + req.path;
    code = "not_found";
  } else if (res.status == 413) {
    message = "the request body is larger than the limit (--max-body)";
    code = "request_too_large";
  }
  SetJson(res, ApiError(res.status, message, "invalid_request_error", "", code).ToJson(),
          res.status);
  engine->metrics().CountRequest("unmatched", res.status);
}

}  // namespace

void ApiServer::Routes() {
  Engine* engine = engine_;
  const std::string* key = &options_.api_key;
  http_->Get("/", Wrap(engine, key, "/", false, [](Req, Res res) {
               res.set_content(reinterpret_cast<const char*>(kChatHtml), sizeof kChatHtml,
                               "text/html; charset=utf-8");
             }));
  http_->Get("/health", Wrap(engine, key, "/health", false,
                             [engine](Req, Res res) { SetJson(res, engine->Health()); }));
  http_->Get("/metrics", Wrap(engine, key, "/metrics", false, [engine](Req, Res res) {
               res.set_content(engine->metrics().Render(engine->admission().in_flight(),
                                                        engine->admission().queued()),
                               "text/plain; version=0.0.4");
             }));
  http_->Get("/v1/models", Wrap(engine, key, "/v1/models", true, [engine](Req, Res res) {
               SetJson(res, {{"object", "list"}, {"data", json::array({ModelObject(*engine)})}});
             }));
  http_->Get("/v1/models/(.+)",
             Wrap(engine, key, "/v1/models/{id}", true, [engine](Req req, Res res) {
               if (req.matches[1] != engine->options().model_name) {
                 throw ApiError(404, "the model '" + req.matches[1].str() + "' does not exist",
                                "invalid_request_error", "model", "model_not_found");
               }
               SetJson(res, ModelObject(*engine));
             }));
  auto post = [&](const std::string& path, auto handler) {
    http_->Post(path, Wrap(engine, key, path, true,
                           [engine, handler](Req req, Res res) { handler(*engine, req, res); }));
  };
  post("/v1/completions",
       [](Engine& e, Req req, Res res) { HandleCompletion(e, req, res, false); });
  post("/v1/chat/completions",
       [](Engine& e, Req req, Res res) { HandleCompletion(e, req, res, true); });
  post("/tokenize", HandleTokenize);
  post("/detokenize", HandleDetokenize);
  post("/apply-template", HandleApplyTemplate);
  http_->set_error_handler([engine](Req req, Res res) { ErrorBody(engine, req, res); });
}

int ApiServer::Bind(const std::string& host, int port) {
  const int bound = port == 0                         ? http_->bind_to_any_port(host)
                    : http_->bind_to_port(host, port) ? port
                                                      : -1;
  if (bound <= 0) {
    throw Error(ErrorKind::kUnavailable,
                "cannot listen on " + host + ":" + std::to_string(port) + " (address in use?)");
  }
  // cpp-httplib 0.11 listens with a backlog of 5: a burst of clients beyond
  // that waits a SYN retransmission (1 s). Linux lets listen() raise it.
  if (listen_fd_ >= 0) ::listen(listen_fd_, SOMAXCONN);
  return bound;
}

void ApiServer::Serve() { http_->listen_after_bind(); }

void ApiServer::Stop() { http_->stop(); }

}  // namespace meshnet::api
