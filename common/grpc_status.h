// The one place where absl status codes and gRPC status codes meet: a one-to-one map
// both ways, so a status crosses an RPC with its code and message unchanged; and the
// guard that keeps an exception in a handler from reaching gRPC unnamed.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/status.h"

namespace pipetrain::common {

grpc::StatusCode ToGrpcCode(absl::StatusCode code);
absl::StatusCode FromGrpcCode(grpc::StatusCode code);

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// What a request is about, for GuardHandler's messages: "METHOD of job 'J' stage S step N
// chunk C" from the request's own fields of those names (job_id, stage, step, chunk),
// then its stage_id and address where it has them ("Coordinator.Heartbeat stage_id
// 'stage-3'"). Fields the message type lacks (or empty strings) are left out; values are
// cut short (common::Truncated), since the request may be the hostile one.
std::string DescribeRequest(absl::string_view method, const google::protobuf::Message& request);

namespace internal {
// GuardHandler's answer to the exception in flight: RESOURCE_EXHAUSTED for an allocation
// that failed, INTERNAL for anything else, each message starting with what the request
// is about (DescribeRequest; just `method` without a request, or if describing fails).
grpc::Status HandlerFailed(absl::string_view method, const google::protobuf::Message* request);
}  // namespace internal

// Runs a gRPC handler's body so that no exception leaves it: gRPC would answer one with
// UNKNOWN "Unexpected error in RPC handling", naming nothing. Sizes a client controls
// are checked before anything is allocated; this is the guard behind those checks. With
// `request`, the message names the job, stage, step or chunk it asked about.
template <typename Body>
grpc::Status GuardHandler(absl::string_view method, Body&& body) {
  try {
    return body();
  } catch (...) {
    return internal::HandlerFailed(method, nullptr);
  }
}
template <typename Body>
grpc::Status GuardHandler(absl::string_view method, const google::protobuf::Message& request,
                          Body&& body) {
  try {
    return body();
  } catch (...) {
    return internal::HandlerFailed(method, &request);
  }
}

}  // namespace pipetrain::common
