// The one place where absl status codes and gRPC status codes meet: a one-to-one map
// both ways, so a status crosses an RPC with its code and message unchanged.
#pragma once

#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace pipetrain::common {

grpc::StatusCode ToGrpcCode(absl::StatusCode code);
absl::StatusCode FromGrpcCode(grpc::StatusCode code);

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Runs a gRPC handler's body so that no exception leaves it: gRPC would answer one with
// UNKNOWN "Unexpected error in RPC handling", naming nothing. Sizes a client controls
// are checked before anything is allocated; this is the guard behind those checks. An
// allocation that fails is RESOURCE_EXHAUSTED naming the method, anything else INTERNAL.
template <typename Body>
grpc::Status GuardHandler(absl::string_view method, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat(method, ": out of memory while answering: the request "
                                             "asks for more than this server can allocate"));
  } catch (const std::length_error& e) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat(method, ": a size in the request is too large (", e.what(),
                                     ")"));
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        absl::StrCat(method, ": unexpected error: ", e.what()));
  }
}

}  // namespace pipetrain::common
