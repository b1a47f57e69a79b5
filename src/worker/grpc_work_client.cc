#include "worker/grpc_work_client.h"

#include <grpcpp/client_context.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/crc32c.h"
#include "rpc/auth.h"
#include "rpc/status_convert.h"
#include "rpc/step_protocol_proto.h"
#include "rpc/weight_chunks.h"
#include "rpc/weight_client.h"
#include "spdlog/spdlog.h"

namespace fusionrl {
namespace {

void Prepare(grpc::ClientContext& ctx, absl::Duration timeout,
             const std::string& token) {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoMilliseconds(timeout));
  rpc::AttachToken(ctx, token);
}

absl::Status Named(const grpc::Status& s, const std::string& what) {
  const absl::Status st = rpc::FromGrpcStatus(s);
  return absl::Status(st.code(), absl::StrCat(what, ": ", st.message()));
}

}  // namespace

GrpcWorkClient::GrpcWorkClient(const std::shared_ptr<grpc::Channel>& channel,
                               std::string auth_token,
                               absl::Duration rpc_timeout,
                               absl::Duration reconnect_timeout)
    : work_(v1::WorkService::NewStub(channel)),
      weight_(v1::WeightService::NewStub(channel)),
      auth_token_(std::move(auth_token)),
      rpc_timeout_(rpc_timeout),
      reconnect_timeout_(reconnect_timeout) {}

template <typename Call>
grpc::Status GrpcWorkClient::WithReconnect(const char* what, Call call) const {
  const absl::Time start = absl::Now();
  absl::Duration backoff = absl::Milliseconds(200);
  bool warned = false;
  for (;;) {
    grpc::Status s = call();
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE ||
        absl::Now() - start >= reconnect_timeout_) {
      if (warned && s.error_code() != grpc::StatusCode::UNAVAILABLE) {
        spdlog::info("{}: the controller answered again after {}", what,
                     absl::FormatDuration(absl::Trunc(absl::Now() - start,
                                                      absl::Milliseconds(1))));
      }
      return s;
    }
    if (!warned) {
      spdlog::warn("{}: controller unreachable ({}); retrying for up to {}",
                   what, s.error_message(),
                   absl::FormatDuration(reconnect_timeout_));
      warned = true;
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

absl::StatusOr<Assignment> GrpcWorkClient::GetAssignment(
    const std::string& node_id, absl::Duration wait) {
  v1::GetAssignmentRequest request;
  request.set_node_id(node_id);
  request.set_wait_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(wait)));
  grpc::ClientContext ctx;
  Prepare(ctx, wait + rpc_timeout_, auth_token_);
  v1::GetAssignmentResponse response;
  grpc::Status s = work_->GetAssignment(&ctx, request, &response);
  if (!s.ok()) return Named(s, "GetAssignment");
  return rpc::AssignmentFromProto(response);
}

absl::StatusOr<StepPlan> GrpcWorkClient::GetStepPlan(const std::string& job_id,
                                                     const std::string& node_id,
                                                     int local_rank,
                                                     int64_t step,
                                                     absl::Duration wait) {
  v1::GetStepPlanRequest request;
  request.set_job_id(job_id);
  request.set_node_id(node_id);
  request.set_local_rank(local_rank);
  request.set_step(step);
  request.set_wait_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(wait)));
  v1::StepPlan plan;
  grpc::Status s = WithReconnect("GetStepPlan", [&] {
    grpc::ClientContext ctx;
    Prepare(ctx, wait + rpc_timeout_, auth_token_);
    return work_->GetStepPlan(&ctx, request, &plan);
  });
  if (!s.ok()) return Named(s, absl::StrCat("GetStepPlan(step ", step, ")"));
  if (plan.kind() != v1::PLAN_KIND_WAIT && plan.kind() != v1::PLAN_KIND_TRAIN &&
      plan.kind() != v1::PLAN_KIND_END &&
      plan.kind() != v1::PLAN_KIND_ABANDON) {
    return absl::UnimplementedError(
        absl::StrCat("GetStepPlan: unknown plan kind ", plan.kind(),
                     " (is the controller a newer version?)"));
  }
  return rpc::StepPlanFromProto(plan);
}

absl::StatusOr<std::string> GrpcWorkClient::Reduce(ReduceCall call,
                                                   absl::Duration timeout) {
  v1::ReduceRequest request;
  request.set_job_id(call.job_id);
  request.set_node_id(call.node_id);
  request.set_step(call.step);
  request.set_attempt(call.attempt);
  request.set_round(call.round);
  request.set_dtype(call.dtype == ReduceDtype::kFloat64
                        ? v1::REDUCE_DTYPE_FLOAT64
                        : v1::REDUCE_DTYPE_FLOAT32);
  *request.mutable_payload() = std::move(call.payload);
  v1::ReduceResponse response;
  grpc::Status s = WithReconnect("Reduce", [&] {
    grpc::ClientContext ctx;
    Prepare(ctx, timeout + rpc_timeout_, auth_token_);
    return work_->Reduce(&ctx, request, &response);
  });
  if (!s.ok()) return rpc::FromGrpcStatus(s);
  return std::move(*response.mutable_payload());
}

absl::StatusOr<bool> GrpcWorkClient::FinishStep(const StepReport& report,
                                                absl::Duration timeout) {
  const v1::FinishStepRequest request = rpc::StepReportToProto(report);
  v1::FinishStepResponse response;
  grpc::Status s = WithReconnect("FinishStep", [&] {
    grpc::ClientContext ctx;
    Prepare(ctx, timeout + rpc_timeout_, auth_token_);
    return work_->FinishStep(&ctx, request, &response);
  });
  if (!s.ok()) {
    return Named(s, absl::StrCat("FinishStep(step ", report.step, ")"));
  }
  return response.committed();
}

absl::StatusOr<std::vector<ReceivedUpdate>> GrpcWorkClient::ExchangeUpdates(
    UpdateCall call, absl::Duration timeout) {
  v1::ExchangeUpdatesRequest request;
  request.set_job_id(call.job_id);
  request.set_due_step(call.due_step);
  request.set_attempt(call.attempt);
  v1::GradientUpdate* u = request.mutable_update();
  u->set_node_id(call.node_id);
  u->set_step(call.step);
  u->set_round(call.round);
  u->set_crc32c(Crc32c(call.payload));
  *u->mutable_payload() = std::move(call.payload);
  v1::ExchangeUpdatesResponse response;
  grpc::Status s = WithReconnect("ExchangeUpdates", [&] {
    grpc::ClientContext ctx;
    Prepare(ctx, timeout + rpc_timeout_, auth_token_);
    return work_->ExchangeUpdates(&ctx, request, &response);
  });
  if (!s.ok()) return rpc::FromGrpcStatus(s);
  std::vector<ReceivedUpdate> out;
  for (v1::GradientUpdate& got : *response.mutable_updates()) {
    if (Crc32c(got.payload()) != got.crc32c()) {
      return absl::DataLossError(
          absl::StrCat("update of ", got.node_id(), " step ", got.step(),
                       " round ", got.round(), ": CRC-32C mismatch"));
    }
    out.push_back({got.step(), std::move(*got.mutable_payload()), got.node_id(),
                   got.round(), got.crc32c()});
  }
  return out;
}

absl::Status GrpcWorkClient::PublishWeights(const std::string& key,
                                            int64_t step,
                                            const std::string& super_node,
                                            const std::string& blob,
                                            absl::Duration timeout) {
  return rpc::PublishWeights(*weight_, key, step, super_node, blob,
                             rpc::kDefaultWeightChunkBytes, timeout,
                             auth_token_);
}

absl::StatusOr<std::string> GrpcWorkClient::FetchWeights(
    const std::string& key, int64_t step, absl::Duration timeout) {
  return rpc::FetchWeights(*weight_, key, step, timeout, nullptr, auth_token_);
}

absl::StatusOr<StoreReply> GrpcWorkClient::Store(const StoreCall& call,
                                                 absl::Duration timeout) {
  const v1::StoreRequest request = rpc::StoreCallToProto(call);
  v1::StoreResponse response;
  grpc::Status s = WithReconnect("Store", [&] {
    grpc::ClientContext ctx;
    Prepare(ctx, timeout + rpc_timeout_, auth_token_);
    return work_->Store(&ctx, request, &response);
  });
  if (!s.ok()) return rpc::FromGrpcStatus(s);
  StoreReply reply;
  reply.value = std::move(*response.mutable_value());
  reply.number = response.number();
  reply.flag = response.flag();
  return reply;
}

}  // namespace fusionrl
