#include "common/grpc_status.h"

#include <cstdint>
#include <exception>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/error_context.h"
#include "common/input_limits.h"
#include "google/protobuf/descriptor.h"

namespace pipetrain::common {
namespace {

// Both enums carry the 17 canonical codes with the same meaning and value; listing
// them explicitly keeps the mapping honest if either side ever renumbers.
struct CodePair {
  absl::StatusCode absl_code;
  grpc::StatusCode grpc_code;
};
constexpr CodePair kCodes[] = {
    {absl::StatusCode::kOk, grpc::StatusCode::OK},
    {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
    {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
    {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
    {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
    {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
    {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
    {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
    {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
    {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
    {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
    {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
    {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
    {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
    {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
    {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
    {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
};

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// A singular integer field `name` of `m`, whatever its width; nullopt if m has none.
std::optional<int64_t> IntField(const Message& m, absl::string_view name) {
  const FieldDescriptor* f = m.GetDescriptor()->FindFieldByName(std::string(name));
  if (f == nullptr || f->is_repeated()) return std::nullopt;
  const auto* r = m.GetReflection();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: return r->GetInt32(m, f);
    case FieldDescriptor::CPPTYPE_INT64: return r->GetInt64(m, f);
    case FieldDescriptor::CPPTYPE_UINT32: return r->GetUInt32(m, f);
    case FieldDescriptor::CPPTYPE_UINT64: return static_cast<int64_t>(r->GetUInt64(m, f));
    default: return std::nullopt;
  }
}

// A singular, non-empty string field `name` of `m`, cut short; "" if m has none.
std::string StringField(const Message& m, absl::string_view name) {
  const FieldDescriptor* f = m.GetDescriptor()->FindFieldByName(std::string(name));
  if (f == nullptr || f->is_repeated() || f->cpp_type() != FieldDescriptor::CPPTYPE_STRING) {
    return "";
  }
  return Truncated(m.GetReflection()->GetString(m, f));
}

// What the failed call was about; only the method if even that cannot be said.
std::string Context(absl::string_view method, const Message* request) {
  if (request == nullptr) return std::string(method);
  try {
    return DescribeRequest(method, *request);
  } catch (...) {
    return std::string(method);
  }
}

}  // namespace

std::string DescribeRequest(absl::string_view method, const Message& request) {
  ErrorContext context(method);
  if (std::string job = StringField(request, "job_id"); !job.empty()) context.Job(job);
  if (auto stage = IntField(request, "stage")) context.Stage(*stage);
  if (auto step = IntField(request, "step")) context.Step(*step);
  if (auto chunk = IntField(request, "chunk")) context.Chunk(*chunk);
  std::string out = context.Text();
  for (absl::string_view field : {"stage_id", "address"}) {
    if (std::string value = StringField(request, field); !value.empty()) {
      absl::StrAppend(&out, " ", field, " '", value, "'");
    }
  }
  return out;
}

namespace internal {

grpc::Status HandlerFailed(absl::string_view method, const Message* request) {
  const std::string context = Context(method, request);
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat(context, ": out of memory while answering: the request "
                                              "asks for more than this server can allocate"));
  } catch (const std::length_error& e) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat(context, ": a size in the request is too large (", e.what(),
                                     ")"));
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        absl::StrCat(context, ": unexpected error: ", e.what()));
  } catch (...) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        absl::StrCat(context, ": unexpected error (not a std::exception)"));
  }
}

}  // namespace internal

grpc::StatusCode ToGrpcCode(absl::StatusCode code) {
  for (const CodePair& p : kCodes) {
    if (p.absl_code == code) return p.grpc_code;
  }
  return grpc::StatusCode::UNKNOWN;
}

absl::StatusCode FromGrpcCode(grpc::StatusCode code) {
  for (const CodePair& p : kCodes) {
    if (p.grpc_code == code) return p.absl_code;
  }
  return absl::StatusCode::kUnknown;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(ToGrpcCode(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(FromGrpcCode(status.error_code()), status.error_message());
}

}  // namespace pipetrain::common
