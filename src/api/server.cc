#include "api/server.h"

#include <httplib.h>
#include <openssl/crypto.h>

#include <utility>

#include "api/api_error.h"
#include "api/chat_html.h"  // generated from chat.html (CMake)
#include "api/engine.h"
#include "api/handlers.h"
#include "http/hardened_server.h"
#include "util/error.h"

namespace meshnet::api {
namespace {

using nlohmann::json;
using Req = const httplib::Request&;
using Res = httplib::Response&;

// Constant-time comparison of the Bearer token with the key.
bool Authorized(const httplib::Request& req, const std::string& key) {
  if (key.empty()) return true;
  const std::string header = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  if (header.size() != prefix.size() + key.size() || header.compare(0, prefix.size(), prefix) != 0)
    return false;
  return CRYPTO_memcmp(header.data() + prefix.size(), key.data(), key.size()) == 0;
}

void RequireKey(Req req, const std::string& key) {
  if (!Authorized(req, key)) {
    throw ApiError(401, "a valid API key is required (Authorization: Bearer KEY)",
                   "invalid_request_error", "", "invalid_api_key");
  }
}

void SetError(httplib::Response& res, const ApiError& e) {
  if (e.status() == 429) res.set_header("Retry-After", "1");
  if (e.status() == 401) res.set_header("WWW-Authenticate", "Bearer");
  SetJson(res, e.ToJson(), e.status());
}

ApiError FromRefusal(const http::Refusal& r) {
  return ApiError(r.status, r.message, r.status >= 500 ? "server_error" : "invalid_request_error",
                  "", r.code);
}

// Runs `fn`: ApiError -> error body, metrics by endpoint+status.
template <typename Fn>
void Guarded(Engine* engine, const std::string& endpoint, Res res, Fn&& fn) {
  try {
    fn();
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
}

// A GET route; `needs_key` checks the API key first.
template <typename Fn>
httplib::Server::Handler WrapGet(Engine* engine, const std::string* api_key, std::string endpoint,
                                 bool needs_key, Fn fn) {
  return [=](Req req, Res res) {
    Guarded(engine, endpoint, res, [&] {
      if (needs_key) RequireKey(req, *api_key);
      fn(req, res);
    });
  };
}

// A POST route: the key is checked before a byte of the body is read; the
// body is read up to --max-body (chunked framing counted as it arrives).
template <typename Fn>
httplib::Server::HandlerWithContentReader WrapPost(Engine* engine, const ServerOptions* options,
                                                   std::string endpoint, Fn fn) {
  return [=](Req req, Res res, const httplib::ContentReader& reader) {
    Guarded(engine, endpoint, res, [&] {
      RequireKey(req, options->api_key);
      std::string body;
      if (auto refused = http::ReadBody(reader, options->max_body_bytes, &body)) {
        throw FromRefusal(*refused);
      }
      fn(*engine, req, std::move(body), res);
    });
  };
}

json ModelObject(const Engine& engine) {
  return {{"id", engine.options().model_name},
          {"object", "model"},
          {"created", 0},
          {"owned_by", "meshnet"}};
}

// Every failure httplib produces itself (unknown path 404, malformed HTTP
// 400) gets an OpenAI-style body too. Handler responses already have a body
// and pass through.
void ErrorBody(Engine* engine, Req req, Res res) {
  if (!res.body.empty()) return;
  std::string message = "request failed with HTTP status " + std::to_string(res.status);
  std::string code;
  if (res.status == 404) {
    message = "no route for " + req.method + " " + req.path;
    code = "not_found";
  }
  SetJson(res, ApiError(res.status, message, "invalid_request_error", "", code).ToJson(),
          res.status);
  engine->metrics().CountRequest("unmatched", res.status);
}

http::HardenedOptions HardenedFrom(const ServerOptions& o, Engine* engine) {
  http::HardenedOptions h;
  h.worker_threads = o.worker_threads;
  h.tls_cert = o.tls_cert;
  h.tls_key = o.tls_key;
  h.connection.head_timeout_s = o.head_timeout_s;
  h.connection.body_timeout_s = o.body_timeout_s;
  h.connection.max_head_bytes = o.max_head_bytes;
  h.connection.max_header_count = o.max_header_count;
  h.connection.max_body_bytes = o.max_body_bytes;
  h.hub.max_connections = o.max_connections;
  h.hub.max_connections_per_ip = o.max_connections_per_ip;
  h.hub.max_ready = static_cast<size_t>(o.worker_threads) * 4;
  // The server's own refusals (431, 408, 413, 415, 503 ...) as OpenAI errors.
  h.refusal_body = [engine](const http::Refusal& r) {
    engine->metrics().CountRequest("refused", r.status);
    return std::pair<std::string, std::string>(
        "application/json",
        FromRefusal(r).ToJson().dump(-1, ' ', false, json::error_handler_t::replace) + "\n");
  };
  return h;
}

}  // namespace

ApiServer::ApiServer(Engine* engine, ServerOptions options)
    : engine_(engine), options_(std::move(options)) {
  http_ = std::make_unique<http::HardenedServer>(HardenedFrom(options_, engine_));
  Routes();
}

ApiServer::~ApiServer() = default;

void ApiServer::Routes() {
  Engine* engine = engine_;
  const std::string* key = &options_.api_key;
  http_->Get("/", WrapGet(engine, key, "/", false, [](Req, Res res) {
               res.set_content(reinterpret_cast<const char*>(kChatHtml), sizeof kChatHtml,
                               "text/html; charset=utf-8");
             }));
  http_->Get("/health", WrapGet(engine, key, "/health", false,
                                [engine](Req, Res res) { SetJson(res, engine->Health()); }));
  http_->Get("/metrics", WrapGet(engine, key, "/metrics", false, [engine](Req, Res res) {
               res.set_content(engine->metrics().Render(engine->admission().in_flight(),
                                                        engine->admission().queued()),
                               "text/plain; version=0.0.4");
             }));
  http_->Get("/v1/models", WrapGet(engine, key, "/v1/models", true, [engine](Req, Res res) {
               SetJson(res, {{"object", "list"}, {"data", json::array({ModelObject(*engine)})}});
             }));
  http_->Get("/v1/models/(.+)",
             WrapGet(engine, key, "/v1/models/{id}", true, [engine](Req req, Res res) {
               if (req.matches[1] != engine->options().model_name) {
                 throw ApiError(404, "the model '" + req.matches[1].str() + "' does not exist",
                                "invalid_request_error", "model", "model_not_found");
               }
               SetJson(res, ModelObject(*engine));
             }));
  auto post = [&](const std::string& path, auto handler) {
    http_->Post(path, WrapPost(engine, &options_, path, handler));
  };
  post("/v1/completions", [](Engine& e, Req req, std::string body, Res res) {
    HandleCompletion(e, req, std::move(body), res, false);
  });
  post("/v1/chat/completions", [](Engine& e, Req req, std::string body, Res res) {
    HandleCompletion(e, req, std::move(body), res, true);
  });
  post("/tokenize", HandleTokenize);
  post("/detokenize", HandleDetokenize);
  post("/apply-template", HandleApplyTemplate);
  http_->SetErrorHandler([engine](Req req, Res res) { ErrorBody(engine, req, res); });
}

int ApiServer::Bind(const std::string& host, int port) { return http_->Bind(host, port); }

void ApiServer::Serve() { http_->Serve(); }

void ApiServer::Stop(std::chrono::steady_clock::time_point hard_deadline) {
  http_->Stop(hard_deadline);
}

}  // namespace meshnet::api
