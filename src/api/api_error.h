// OpenAI-style API errors: every rejected request is answered with
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// and an HTTP status that says whose fault it is (4xx: the request's; 503:
// no route). Handlers throw ApiError; the server turns it into the response.
//
// Thread-safety: value types.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace meshnet::api {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string type, std::string param = "",
           std::string code = "");
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  // {"error":{"message","type","param","code"}}; empty param/code are null.
  nlohmann::json ToJson() const;

 private:
  int status_;
  std::string type_;
  std::string param_;
  std::string code_;
};

// 400 invalid_request_error naming the offending parameter.
[[noreturn]] void ThrowBadRequest(const std::string& message, const std::string& param = "",
                                  const std::string& code = "");

}  // namespace meshnet::api
