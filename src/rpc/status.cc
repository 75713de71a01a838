#include "rpc/status.h"

#include <array>

namespace meshnet::rpc {

namespace {

constexpr std::array<ErrorKind, 10> kAllKinds = {
    ErrorKind::kInvalidArgument,  ErrorKind::kStaleEpoch,    ErrorKind::kIncompatibleRecipe,
    ErrorKind::kBudgetExceeded,   ErrorKind::kCacheMiss,     ErrorKind::kSessionBusy,
    ErrorKind::kBoundaryContract, ErrorKind::kMalformedFile, ErrorKind::kUnavailable,
    ErrorKind::kPermissionDenied,
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

grpc::Status PermissionDenied(const std::string& message) {
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, message);
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
  const ErrorKind kind = ErrorKindFor(status.error_code(), kind_name);
  throw Error(kind, peer + ": " + method + ": " + status.error_message());
}

}  // namespace meshnet::rpc

#if defined(__SANITIZE_THREAD__)
// Under ThreadSanitizer: gRPC, protobuf, abseil and OpenSSL come from Debian,
// not instrumented, so TSan cannot see their internal synchronization and
// reports races inside them (abseil's deadlock graph, OpenSSL buffers, status
// strings filled by gRPC threads). Worse, matching each such report against
// suppressions costs a symbolization, slow enough to blow RPC deadlines. So:
// interceptors called from those libraries are ignored (called_from_lib needs
// one entry per library), and races whose stacks run through them or through
// gRPC's inline call machinery are suppressed. Our own code stays fully
// checked. status.cc is linked into every binary that uses rpc/ (node and
// client), so this covers `meshnet serve` too.
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libabsl_bad_optional_access.so\n"
         "called_from_lib:libabsl_bad_variant_access.so\n"
         "called_from_lib:libabsl_base.so\n"
         "called_from_lib:libabsl_city.so\n"
         "called_from_lib:libabsl_civil_time.so\n"
         "called_from_lib:libabsl_cord.so\n"
         "called_from_lib:libabsl_cord_internal.so\n"
         "called_from_lib:libabsl_cordz_functions.so\n"
         "called_from_lib:libabsl_cordz_handle.so\n"
         "called_from_lib:libabsl_cordz_info.so\n"
         "called_from_lib:libabsl_debugging_internal.so\n"
         "called_from_lib:libabsl_demangle_internal.so\n"
         "called_from_lib:libabsl_exponential_biased.so\n"
         "called_from_lib:libabsl_graphcycles_internal.so\n"
         "called_from_lib:libabsl_hash.so\n"
         "called_from_lib:libabsl_hashtablez_sampler.so\n"
         "called_from_lib:libabsl_int128.so\n"
         "called_from_lib:libabsl_log_severity.so\n"
         "called_from_lib:libabsl_low_level_hash.so\n"
         "called_from_lib:libabsl_malloc_internal.so\n"
         "called_from_lib:libabsl_random_distributions.so\n"
         "called_from_lib:libabsl_random_internal_platform.so\n"
         "called_from_lib:libabsl_random_internal_pool_urbg.so\n"
         "called_from_lib:libabsl_random_internal_randen.so\n"
         "called_from_lib:libabsl_random_internal_randen_hwaes.so\n"
         "called_from_lib:libabsl_random_internal_randen_hwaes_impl.so\n"
         "called_from_lib:libabsl_random_internal_randen_slow.so\n"
         "called_from_lib:libabsl_random_internal_seed_material.so\n"
         "called_from_lib:libabsl_random_seed_gen_exception.so\n"
         "called_from_lib:libabsl_random_seed_sequences.so\n"
         "called_from_lib:libabsl_raw_hash_set.so\n"
         "called_from_lib:libabsl_raw_logging_internal.so\n"
         "called_from_lib:libabsl_spinlock_wait.so\n"
         "called_from_lib:libabsl_stacktrace.so\n"
         "called_from_lib:libabsl_status.so\n"
         "called_from_lib:libabsl_statusor.so\n"
         "called_from_lib:libabsl_str_format_internal.so\n"
         "called_from_lib:libabsl_strerror.so\n"
         "called_from_lib:libabsl_strings.so\n"
         "called_from_lib:libabsl_strings_internal.so\n"
         "called_from_lib:libabsl_symbolize.so\n"
         "called_from_lib:libabsl_synchronization.so\n"
         "called_from_lib:libabsl_throw_delegate.so\n"
         "called_from_lib:libabsl_time.so\n"
         "called_from_lib:libabsl_time_zone.so\n"
         "called_from_lib:libgrpc++.so\n"
         "called_from_lib:libgrpc.so\n"
         "called_from_lib:libgpr.so\n"
         "called_from_lib:libupb.so\n"
         "called_from_lib:libprotobuf.so\n"
         "called_from_lib:libcrypto.so\n"
         "called_from_lib:libssl.so\n"
         "race:libabsl_\n"
         "race:libgrpc\n"
         "race:libgpr.so\n"
         "race:libupb.so\n"
         "race:libprotobuf\n"
         "race:libcrypto.so\n"
         "race:libssl.so\n"
         "race:grpc::internal::\n"
         "race:grpc::CompletionQueue\n"
         "deadlock:libabsl_\n"
         "deadlock:libgrpc\n";
}
#endif
