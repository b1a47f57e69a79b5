#include "rpc/weight_client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/support/sync_stream.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "rpc/auth.h"
#include "rpc/status_convert.h"
#include "rpc/weight_chunks.h"

namespace fusionrl::rpc {
namespace {

using fusionrl::v1::FetchWeightsRequest;
using fusionrl::v1::PublishWeightsResponse;
using fusionrl::v1::WeightChunk;

absl::Status CheckDeadline(absl::Duration deadline) {
  if (deadline <= absl::ZeroDuration() ||
      deadline == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("deadline: must be finite and > 0, got ",
                     absl::FormatDuration(deadline)));
  }
  return absl::OkStatus();
}

// `status` with "<what>: " before its message (and the deadline, when that is
// what ran out).
absl::Status WithContext(const std::string& what, absl::Status status,
                         absl::Duration deadline) {
  if (status.ok()) return status;
  std::string message = absl::StrCat(what, ": ", status.message());
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    absl::StrAppend(&message, " (deadline ", absl::FormatDuration(deadline),
                    ")");
  }
  return absl::Status(status.code(), message);
}

}  // namespace

absl::Status PublishWeights(fusionrl::v1::WeightService::StubInterface& stub,
                            const std::string& job_id, int64_t version,
                            const std::string& super_node,
                            absl::string_view bytes, size_t chunk_bytes,
                            absl::Duration deadline,
                            const std::string& auth_token) {
  const std::string what =
      absl::StrCat("PublishWeights(", job_id, " version ", version, ")");
  if (chunk_bytes < 1 || chunk_bytes > kMaxWeightChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": chunk_bytes must be in [1, ",
                     kMaxWeightChunkBytes, "], got ", chunk_bytes));
  }
  if (absl::Status s = CheckDeadline(deadline); !s.ok()) {
    return WithContext(what, s, deadline);
  }

  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  AttachToken(context, auth_token);
  PublishWeightsResponse response;
  std::unique_ptr<grpc::ClientWriterInterface<WeightChunk>> writer =
      stub.PublishWeights(&context, &response);
  WeightChunker chunker(job_id, version, super_node, bytes, chunk_bytes);
  WeightChunk chunk;
  while (chunker.Next(&chunk)) {
    // A failed write means the call is over (the server rejected the stream,
    // the deadline passed, ...): Finish() says why.
    if (!writer->Write(chunk)) break;
  }
  writer->WritesDone();
  absl::Status status = FromGrpcStatus(writer->Finish());
  if (!status.ok()) return WithContext(what, status, deadline);
  if (response.version() != version ||
      response.total_bytes() != static_cast<int64_t>(bytes.size())) {
    return absl::InternalError(absl::StrCat(
        what, ": the server acknowledged version ", response.version(), " of ",
        response.total_bytes(), " bytes, not ", bytes.size(), " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FetchWeights(
    fusionrl::v1::WeightService::StubInterface& stub, const std::string& job_id,
    int64_t version, absl::Duration deadline, int64_t* version_out,
    const std::string& auth_token) {
  const std::string what =
      absl::StrCat("FetchWeights(", job_id, " version ", version, ")");
  if (absl::Status s = CheckDeadline(deadline); !s.ok()) {
    return WithContext(what, s, deadline);
  }

  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  AttachToken(context, auth_token);
  FetchWeightsRequest request;
  request.set_job_id(job_id);
  request.set_version(version);
  std::unique_ptr<grpc::ClientReaderInterface<WeightChunk>> reader =
      stub.FetchWeights(&context, request);

  WeightChunkAssembler assembler;
  WeightChunk chunk;
  absl::Status broken;  // the first check that failed, as DataLoss
  while (reader->Read(&chunk)) {
    absl::Status s = assembler.Add(chunk);
    if (s.ok() && (chunk.job_id() != job_id ||
                   (version != 0 && chunk.version() != version))) {
      s = absl::InvalidArgumentError(absl::StrCat(
          "chunk at offset ", chunk.offset(), " is of ", chunk.job_id(),
          " version ", chunk.version(), ", not the one asked for"));
    }
    if (!s.ok()) {
      // Whatever the assembler objects to, the bytes that came are not the
      // version that was sent: DataLoss. Stop the transfer.
      broken = absl::DataLossError(s.message());
      context.TryCancel();
      break;
    }
  }
  absl::Status status = FromGrpcStatus(reader->Finish());
  if (!broken.ok()) return WithContext(what, broken, deadline);
  if (!status.ok()) return WithContext(what, status, deadline);
  if (!assembler.done()) {
    return WithContext(what, absl::DataLossError(assembler.EndedEarlyMessage()),
                       deadline);
  }
  if (version_out != nullptr) *version_out = assembler.version();
  return assembler.TakeBytes();
}

}  // namespace fusionrl::rpc
