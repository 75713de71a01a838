#include "rpc/status.h"

#include <spdlog/spdlog.h>

#include <array>

namespace meshnet::rpc {

namespace {

constexpr std::array<ErrorKind, 11> kAllKinds = {
    ErrorKind::kInvalidArgument,  ErrorKind::kStaleEpoch,        ErrorKind::kIncompatibleRecipe,
    ErrorKind::kBudgetExceeded,   ErrorKind::kCacheMiss,         ErrorKind::kSessionBusy,
    ErrorKind::kBoundaryContract, ErrorKind::kMalformedFile,     ErrorKind::kUnavailable,
    ErrorKind::kPermissionDenied, ErrorKind::kResourceExhausted,
};

}  // namespace

std::optional<ErrorKind> ParseErrorKindName(std::string_view name) {
  for (ErrorKind k : kAllKinds) {
    if (ErrorKindName(k) == name) return k;
  }
  return std::nullopt;
}

grpc::StatusCode StatusCodeFor(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
    case ErrorKind::kBoundaryContract:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case ErrorKind::kStaleEpoch:
    case ErrorKind::kSessionBusy:
      return grpc::StatusCode::ABORTED;
    case ErrorKind::kIncompatibleRecipe:
      return grpc::StatusCode::FAILED_PRECONDITION;
    case ErrorKind::kBudgetExceeded:
    case ErrorKind::kResourceExhausted:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case ErrorKind::kCacheMiss:
      return grpc::StatusCode::NOT_FOUND;
    case ErrorKind::kUnavailable:
      return grpc::StatusCode::UNAVAILABLE;
    case ErrorKind::kPermissionDenied:
      return grpc::StatusCode::PERMISSION_DENIED;
    case ErrorKind::kMalformedFile:
      return grpc::StatusCode::INTERNAL;
  }
  return grpc::StatusCode::INTERNAL;
}

grpc::Status ToStatus(const Error& e, grpc::ServerContext* context) {
  if (context != nullptr) {
    context->AddTrailingMetadata(kErrorKindKey, std::string(ErrorKindName(e.kind())));
  }
  return grpc::Status(StatusCodeFor(e.kind()), e.what());
}

ErrorKind ErrorKindFor(grpc::StatusCode code, std::optional<std::string_view> kind_name) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
      return ErrorKind::kUnavailable;  // the transport failed, whatever a trailer says
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
      return ErrorKind::kPermissionDenied;
    default:
      break;
  }
  if (kind_name) {
    if (auto k = ParseErrorKindName(*kind_name)) return *k;
  }
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT:
      return ErrorKind::kInvalidArgument;
    case grpc::StatusCode::ABORTED:
      return ErrorKind::kStaleEpoch;
    case grpc::StatusCode::FAILED_PRECONDITION:
      return ErrorKind::kIncompatibleRecipe;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return ErrorKind::kBudgetExceeded;
    case grpc::StatusCode::NOT_FOUND:
      return ErrorKind::kCacheMiss;
    default:
      return ErrorKind::kUnavailable;  // INTERNAL, UNKNOWN, UNIMPLEMENTED...: a broken peer
  }
}

void ThrowForStatus(const grpc::Status& status, const grpc::ClientContext& context,
                    const std::string& peer, const char* method) {
  std::optional<std::string_view> kind_name;
  const auto& trailers = context.GetServerTrailingMetadata();
  if (auto it = trailers.find(kErrorKindKey); it != trailers.end()) {
    kind_name = std::string_view(it->second.data(), it->second.size());
  }
  ThrowForCode(status.error_code(), kind_name, status.error_message(), peer, method);
}

void ThrowForCode(grpc::StatusCode code, std::optional<std::string_view> kind_name,
                  const std::string& message, const std::string& peer, const char* method) {
  throw Error(ErrorKindFor(code, kind_name), peer + ": " + method + ": " + message);
}

grpc::Status RunCaught(const grpc::ServerContext& ctx, const char* event, bool info,
                       const std::function<void()>& body, std::optional<ErrorKind>* kind) {
  kind->reset();
  try {
    body();
    return grpc::Status::OK;
  } catch (const Error& e) {
    spdlog::log(info ? spdlog::level::info : spdlog::level::debug,
                "event={} peer={} kind={} message=\"{}\"", event, ctx.peer(),
                ErrorKindName(e.kind()), e.what());
    *kind = e.kind();
    return ToStatus(e);
  } catch (const std::exception& e) {
    spdlog::error("event=call_crashed peer={} message=\"{}\"", ctx.peer(), e.what());
    return grpc::Status(grpc::StatusCode::INTERNAL, e.what());
  }
}

grpc::Status RunToStatus(grpc::ServerContext* ctx, const char* event, bool info,
                         const std::function<void()>& body) {
  std::optional<ErrorKind> kind;
  grpc::Status s = RunCaught(*ctx, event, info, body, &kind);
  if (kind) ctx->AddTrailingMetadata(kErrorKindKey, std::string(ErrorKindName(*kind)));
  return s;
}

}  // namespace meshnet::rpc
