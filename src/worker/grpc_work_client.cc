#include "worker/grpc_work_client.h"

#include <grpcpp/client_context.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/crc32c.h"
#include "core/metrics.h"
#include "rpc/auth.h"
#include "rpc/status_convert.h"
#include "rpc/weight_chunks.h"
#include "rpc/weight_client.h"

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

PlanKind KindFromProto(v1::PlanKind kind) {
  switch (kind) {
    case v1::PLAN_KIND_TRAIN:
      return PlanKind::kTrain;
    case v1::PLAN_KIND_END:
      return PlanKind::kEnd;
    case v1::PLAN_KIND_ABANDON:
      return PlanKind::kAbandon;
    default:
      return PlanKind::kWait;
  }
}

}  // namespace

GrpcWorkClient::GrpcWorkClient(const std::shared_ptr<grpc::Channel>& channel,
                               std::string auth_token,
                               absl::Duration rpc_timeout)
    : work_(v1::WorkService::NewStub(channel)),
      weight_(v1::WeightService::NewStub(channel)),
      auth_token_(std::move(auth_token)),
      rpc_timeout_(rpc_timeout) {}

StepPlan GrpcWorkClient::FromProto(const v1::StepPlan& p) {
  StepPlan plan;
  plan.kind = KindFromProto(p.kind());
  plan.step = p.step();
  plan.attempt = p.attempt();
  plan.rank = p.rank();
  plan.world_size = p.world_size();
  plan.nodes = p.nodes();
  plan.groups.assign(p.groups().begin(), p.groups().end());
  plan.eval_before = p.eval_before();
  plan.eval_after = p.eval_after();
  plan.checkpoint_name = p.checkpoint_name();
  plan.rollout_tokens_before = p.rollout_tokens_before();
  plan.loop_seconds_before = p.loop_seconds_before();
  plan.initial_eval_accuracy = p.initial_eval_accuracy();
  plan.last_eval_accuracy = p.last_eval_accuracy();
  plan.message = p.message();
  plan.data_cursor_after = p.data_cursor_after();
  plan.exchange_updates = p.exchange_updates();
  plan.updates_due_step = p.updates_due_step();
  plan.sync_weights = p.sync_weights();
  return plan;
}

v1::FinishStepRequest GrpcWorkClient::ToProto(const StepReport& r) {
  v1::FinishStepRequest out;
  out.set_job_id(r.job_id);
  out.set_node_id(r.node_id);
  out.set_step(r.step);
  out.set_attempt(r.attempt);
  if (!r.metrics.empty()) out.set_metrics_json(MetricRecordToJson(r.metrics));
  out.set_rollout_tokens(r.rollout_tokens);
  out.set_loop_seconds(r.loop_seconds);
  out.set_initial_eval_accuracy(r.initial_eval_accuracy);
  out.set_eval_accuracy(r.eval_accuracy);
  out.set_checkpoint_dir(r.checkpoint_dir);
  out.set_reward_mean(r.reward_mean);
  out.set_train_accuracy(r.train_accuracy);
  out.set_policy_version(r.policy_version);
  if (!r.error.ok()) {
    out.set_error(std::string(r.error.message()));
    out.set_error_code(static_cast<int>(r.error.code()));
  }
  out.set_has_weights_crc32c(r.has_weights_crc32c);
  out.set_weights_crc32c(r.weights_crc32c);
  return out;
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
  Assignment a;
  a.job_id = response.job_id();
  a.config_yaml = response.config_yaml();
  a.source_name = response.source_name();
  a.overrides.assign(response.overrides().begin(), response.overrides().end());
  a.card_indices.assign(response.card_indices().begin(),
                        response.card_indices().end());
  a.resume_checkpoint = response.resume_checkpoint();
  a.rollout_cards = response.rollout_cards();
  return a;
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
  grpc::ClientContext ctx;
  Prepare(ctx, wait + rpc_timeout_, auth_token_);
  v1::StepPlan plan;
  grpc::Status s = work_->GetStepPlan(&ctx, request, &plan);
  if (!s.ok()) return Named(s, absl::StrCat("GetStepPlan(step ", step, ")"));
  if (plan.kind() != v1::PLAN_KIND_WAIT && plan.kind() != v1::PLAN_KIND_TRAIN &&
      plan.kind() != v1::PLAN_KIND_END && plan.kind() != v1::PLAN_KIND_ABANDON) {
    return absl::UnimplementedError(
        absl::StrCat("GetStepPlan: unknown plan kind ", plan.kind(),
                     " (is the controller a newer version?)"));
  }
  return FromProto(plan);
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
  grpc::ClientContext ctx;
  Prepare(ctx, timeout + rpc_timeout_, auth_token_);
  v1::ReduceResponse response;
  grpc::Status s = work_->Reduce(&ctx, request, &response);
  if (!s.ok()) return rpc::FromGrpcStatus(s);
  return std::move(*response.mutable_payload());
}

absl::StatusOr<bool> GrpcWorkClient::FinishStep(const StepReport& report,
                                                absl::Duration timeout) {
  const v1::FinishStepRequest request = ToProto(report);
  grpc::ClientContext ctx;
  Prepare(ctx, timeout + rpc_timeout_, auth_token_);
  v1::FinishStepResponse response;
  grpc::Status s = work_->FinishStep(&ctx, request, &response);
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
  v1::GradientUpdate* u = request.mutable_update();
  u->set_node_id(call.node_id);
  u->set_step(call.step);
  u->set_round(call.round);
  u->set_crc32c(Crc32c(call.payload));
  *u->mutable_payload() = std::move(call.payload);
  grpc::ClientContext ctx;
  Prepare(ctx, timeout + rpc_timeout_, auth_token_);
  v1::ExchangeUpdatesResponse response;
  grpc::Status s = work_->ExchangeUpdates(&ctx, request, &response);
  if (!s.ok()) return rpc::FromGrpcStatus(s);
  std::vector<ReceivedUpdate> out;
  for (v1::GradientUpdate& got : *response.mutable_updates()) {
    if (Crc32c(got.payload()) != got.crc32c()) {
      return absl::DataLossError(
          absl::StrCat("update of ", got.node_id(), " step ", got.step(),
                       " round ", got.round(), ": CRC-32C mismatch"));
    }
    out.push_back({got.step(), std::move(*got.mutable_payload())});
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

}  // namespace fusionrl
