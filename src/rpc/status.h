// meshnet::Error <-> grpc::Status, the one place the two error models meet
// (the table is in proto/meshnet.proto). Internal to rpc/.
//
// The node sends the exact ErrorKind name as trailing metadata
// "meshnet-error-kind"; the client prefers it and falls back to the status
// code, so a client can talk to a node that does not send it.
//
// Thread-safety: pure functions.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "util/error.h"

namespace meshnet::rpc {

inline constexpr const char* kErrorKindKey = "meshnet-error-kind";

grpc::StatusCode StatusCodeFor(ErrorKind kind);
// Status for a meshnet error (message kept), with the kind in `context`'s
// trailing metadata when a context is given.
grpc::Status ToStatus(const Error& e, grpc::ServerContext* context = nullptr);

// The kind for a status returned to a client. `kind_name` is the trailer value
// if the node sent one. PERMISSION_DENIED and UNAUTHENTICATED map to
// kPermissionDenied; UNAVAILABLE, DEADLINE_EXCEEDED and CANCELLED to
// kUnavailable; unknown codes to kUnavailable (a broken peer).
ErrorKind ErrorKindFor(grpc::StatusCode code, std::optional<std::string_view> kind_name);

// Throws Error(kind) for a non-OK status: "<peer>: <method>: <message>".
// ThrowForCode: the same from a code and the kind name the node sent (the
// trailer, or a StepMany outcome's kind).
[[noreturn]] void ThrowForCode(grpc::StatusCode code, std::optional<std::string_view> kind_name,
                               const std::string& message, const std::string& peer,
                               const char* method);
[[noreturn]] void ThrowForStatus(const grpc::Status& status, const grpc::ClientContext& context,
                                 const std::string& peer, const char* method);

std::optional<ErrorKind> ParseErrorKindName(std::string_view name);

// A server handler's body run to its status: OK; for a meshnet::Error thrown,
// ToStatus (logged as `event` with the peer, kind and message, at info level
// when `info`, else debug); for anything else INTERNAL, logged as an error.
grpc::Status RunToStatus(grpc::ServerContext* ctx, const char* event, bool info,
                         const std::function<void()>& body);
// The same, leaving the context alone (the steps of one StepMany share it):
// `kind` gets a failed body's meshnet error kind (unset for OK or another
// exception), for the caller to report.
grpc::Status RunCaught(const grpc::ServerContext& ctx, const char* event, bool info,
                       const std::function<void()>& body, std::optional<ErrorKind>* kind);

}  // namespace meshnet::rpc
