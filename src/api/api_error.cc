#include "api/api_error.h"

#include <utility>

namespace meshnet::api {

ApiError::ApiError(int status, std::string message, std::string type, std::string param,
                   std::string code)
    : std::runtime_error(std::move(message)),
      status_(status),
      type_(std::move(type)),
      param_(std::move(param)),
      code_(std::move(code)) {}

nlohmann::json ApiError::ToJson() const {
  nlohmann::json e;
  e["message"] = what();
  e["type"] = type_;
  e["param"] = param_.empty() ? nlohmann::json(nullptr) : nlohmann::json(param_);
  e["code"] = code_.empty() ? nlohmann::json(nullptr) : nlohmann::json(code_);
  return {{"error", e}};
}

void ThrowBadRequest(const std::string& message, const std::string& param,
                     const std::string& code) {
  throw ApiError(400, message, "invalid_request_error", param, code);
}

}  // namespace meshnet::api
