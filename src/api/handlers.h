// Request handlers of the API server (internal to src/api). Each gets the
// request's body (read by server.cc within --max-body) and throws ApiError
// for a request it refuses; server.cc turns that into the response.
#pragma once

#include <httplib.h>

#include <string>

#include "api/engine.h"

namespace meshnet::api {

// POST /v1/completions (chat=false) and /v1/chat/completions (chat=true),
// streaming (SSE) or not.
void HandleCompletion(Engine& engine, const httplib::Request& req, std::string body,
                      httplib::Response& res, bool chat);
// POST /tokenize, /detokenize, /apply-template.
void HandleTokenize(Engine& engine, const httplib::Request& req, std::string body,
                    httplib::Response& res);
void HandleDetokenize(Engine& engine, const httplib::Request& req, std::string body,
                      httplib::Response& res);
void HandleApplyTemplate(Engine& engine, const httplib::Request& req, std::string body,
                         httplib::Response& res);

// Writes `j` as the JSON body.
void SetJson(httplib::Response& res, const nlohmann::json& j, int status = 200);

}  // namespace meshnet::api
