// Supervised warm start (`fusionrl sft`) and checkpoint evaluation
// (`fusionrl eval`).
//
// SFT trains the policy to produce each training problem's reference
// solution followed by eos: token-mean cross-entropy on the response tokens
// only (the prompt is context, not a target). RL then starts from a policy
// that knows the task's format and sometimes succeeds, as real post-training
// starts from an SFT model.
#include <ATen/ATen.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/job_summary.h"
#include "core/metrics.h"
#include "core/status_macros.h"
#include "engine/jobs/evaluate.h"
#include "engine/jobs/job_setup.h"
#include "engine/kernels/invariant_ops.h"
#include "engine/rollout/agent_loop.h"
#include "engine/train/activation_planner.h"
#include "engine/train/checkpoint.h"
#include "engine/train/master_weights.h"
#include "engine/train/trainer.h"
#include "fusionrl/job.h"
#include "spdlog/spdlog.h"

namespace fusionrl {

namespace {

// One SFT batch of sft.batch_size training problems from `cursor` on:
// a demonstrated episode where the environment has one, else the reference
// solution. Adds the response tokens to `tokens`.
absl::StatusOr<std::vector<Sample>> SftBatch(const JobConfig& config,
                                             JobContext& ctx, uint64_t& cursor,
                                             int64_t& tokens) {
  const int max_new = config.rollout.max_new_tokens;
  std::vector<Sample> batch;
  for (int i = 0; i < config.sft.batch_size; ++i) {
    const Problem p = ctx.task->TrainProblem(cursor++);
    if (ctx.environment != nullptr) {
      // Multi-turn: a demonstrated episode (its environment tokens masked
      // out of the loss), where the environment has demonstrations.
      absl::StatusOr<Sample> demo = DemonstrationSample(ctx, p, cursor);
      if (demo.ok()) {
        tokens += static_cast<int64_t>(demo->response_ids.size());
        batch.push_back(*std::move(demo));
        continue;
      }
      if (!absl::IsNotFound(demo.status())) return demo.status();
    }
    FUSIONRL_ASSIGN_OR_RETURN(Sample s, SolutionSample(ctx, p));
    if (static_cast<int>(s.response_ids.size()) > max_new) {
      return absl::InvalidArgumentError(
          absl::StrCat("rollout.max_new_tokens: the reference solution of '",
                       p.prompt, "' needs ", s.response_ids.size(),
                       " tokens (eos included), more "
                       "than ",
                       max_new));
    }
    tokens += static_cast<int64_t>(s.response_ids.size());
    batch.push_back(std::move(s));
  }
  return batch;
}

// One optimizer step of SFT: its loss (the likelihood term), the MoE
// auxiliary loss (undefined for a dense policy), pre-clip norm and rate.
struct SftStep {
  at::Tensor loss;
  at::Tensor aux;
  double grad_norm = 0;
  double lr = 0;
};

SftStep TrainSftBatch(PolicyModel& policy, MasterWeightAdamW& adamw,
                      const JobConfig& config, const OptimConfig& schedule,
                      const CollatedBatch& cb, int step) {
  const auto& o = config.optim;
  SftStep r;
  policy.set_training(true);
  adamw.ZeroGrad();
  auto logp = ResponseTokenLogProbs(policy, cb, 1.0,
                                    config.optim.logits_chunk_tokens, false)
                  .logp;
  r.loss = -(logp * cb.response_mask).sum() / cb.response_mask.sum();
  // MoE: the router's load-balancing and z losses join the objective, as
  // in RL training (the logged "loss" stays the likelihood term).
  r.aux = policy.AuxLoss();
  (r.aux.defined() ? r.loss + r.aux : r.loss).backward();
  adamw.GradientsToMasters();
  r.grad_norm = o.grad_clip > 0
                    ? InvariantClipGradNorm(adamw.stepped(), o.grad_clip)
                    : 0.0;
  r.lr = LearningRateAt(schedule, step - 1);
  adamw.SetLearningRate(r.lr);
  adamw.Step();
  return r;
}

// A step's metrics line (without the eval accuracy).
MetricRecord SftMetrics(int step, double loss_v, const SftStep& r,
                        PolicyModel& policy) {
  MetricRecord rec = {{"step", step},
                      {"loss", loss_v},
                      {"grad_norm", r.grad_norm},
                      {"lr", r.lr}};
  if (!r.aux.defined()) return rec;
  const MoeStats ms = policy.moe_stats();
  rec.push_back({"moe_aux_loss", ms.aux_loss});
  rec.push_back({"moe_z_loss", ms.z_loss});
  rec.push_back({"moe_dropped_frac", ms.dropped_frac});
  for (size_t i = 0; i < ms.expert_load.size(); ++i) {
    rec.push_back({absl::StrCat("moe_load_", i), ms.expert_load[i]});
  }
  for (size_t g = 0; ms.group_load.size() > 1 && g < ms.group_load.size();
       ++g) {
    rec.push_back({absl::StrCat("moe_group_load_", g), ms.group_load[g]});
  }
  return rec;
}

// The final checkpoint into summary.checkpoint_dir (and the HF export).
absl::Status WriteFinalSftCheckpoint(const JobConfig& config, JobContext& ctx,
                                     uint64_t cursor, JobSummary& summary) {
  summary.checkpoint_dir = config.output_dir + "/checkpoints/final";
  FUSIONRL_RETURN_IF_ERROR(
      WriteCheckpoint(summary.checkpoint_dir, *ctx.policy, nullptr,
                      CheckpointMeta{"sft", config.name, config.sft.steps, 0,
                                     cursor, LoraBaseModel(config)}));
  if (config.run.export_final) {
    FUSIONRL_RETURN_IF_ERROR(
        ExportJobPolicy(config, ctx, *ctx.policy, config.output_dir + "/hf"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobSummary> RunSftJob(const JobConfig& config) {
  const auto job_start = RealClock().MonotonicNow();
  FUSIONRL_RETURN_IF_ERROR(ValidateJobConfig(config));
  const std::string& out = config.output_dir;
  FUSIONRL_ASSIGN_OR_RETURN(JobContext ctx, PrepareJob(config, out));
  PolicyModel& policy = *ctx.policy;
  // model.activations.policy auto: plan for a full batch.
  FUSIONRL_RETURN_IF_ERROR(
      PlanActivationsForJob(policy, config.sft.batch_size).status());
  FUSIONRL_ASSIGN_OR_RETURN(auto metrics,
                            MetricsLog::Open(out + "/metrics.jsonl", true));
  const auto& sc = config.sft;
  const auto& o = config.optim;
  // Float32 master weights for a bf16 policy (engine/train/master_weights.h).
  // With LoRA the adapters only.
  MasterWeightAdamW adamw(policy.trainable_parameters(),
                          AdamWSettingsOf(o, sc.lr));
  OptimConfig schedule = o;
  schedule.lr = sc.lr;
  schedule.warmup_steps = sc.warmup_steps;
  const int max_new = config.rollout.max_new_tokens;

  FUSIONRL_ASSIGN_OR_RETURN(EvalResult initial,
                            EvaluateGreedy(policy, ctx, max_new));
  spdlog::info("[{}] sft: {} parameters, initial eval accuracy {:.3f}",
               config.name, policy.num_parameters(), initial.accuracy);
  JobSummary summary;
  summary.kind = "sft";
  summary.initial_eval_accuracy = initial.accuracy;
  summary.summary_path = out + "/summary.json";
  double last_eval = initial.accuracy;
  uint64_t cursor = 0;
  double train_seconds = 0;
  int64_t tokens = 0;
  for (int step = 1; step <= sc.steps; ++step) {
    const auto t0 = RealClock().MonotonicNow();
    FUSIONRL_ASSIGN_OR_RETURN(std::vector<Sample> batch,
                              SftBatch(config, ctx, cursor, tokens));
    const CollatedBatch cb =
        Collate(batch, ctx.tokenizer->pad_id(), ctx.device);
    const SftStep r = TrainSftBatch(policy, adamw, config, schedule, cb, step);
    train_seconds += RealClock().SecondsSince(t0);
    const double loss_v = r.loss.item<double>();
    if (!std::isfinite(loss_v)) {
      return absl::InternalError(absl::StrCat(
          "sft: loss became non-finite at step ", step, "; lower sft.lr"));
    }
    MetricRecord rec = SftMetrics(step, loss_v, r, policy);
    const bool eval_now =
        (sc.eval_every > 0 && step % sc.eval_every == 0) || step == sc.steps;
    if (eval_now) {
      FUSIONRL_ASSIGN_OR_RETURN(EvalResult ev,
                                EvaluateGreedy(policy, ctx, max_new));
      last_eval = ev.accuracy;
      rec.push_back({"eval_accuracy", ev.accuracy});
      spdlog::info("[{}] sft step {}/{} | loss {:.4f} | eval {:.3f} | ETA {}",
                   config.name, step, sc.steps, loss_v, ev.accuracy,
                   FormatDuration(train_seconds / step * (sc.steps - step)));
    }
    FUSIONRL_RETURN_IF_ERROR(metrics->Append(rec));
  }
  FUSIONRL_RETURN_IF_ERROR(
      WriteFinalSftCheckpoint(config, ctx, cursor, summary));
  summary.final_eval_accuracy = last_eval;
  summary.steps = sc.steps;
  summary.tokens_per_second = train_seconds > 0 ? tokens / train_seconds : 0;
  summary.wall_seconds = RealClock().SecondsSince(job_start);
  FUSIONRL_RETURN_IF_ERROR(WriteSummary(summary));
  spdlog::info(
      "[{}] sft done: eval accuracy {:.3f} -> {:.3f} in {}; "
      "checkpoint {}",
      config.name, summary.initial_eval_accuracy, summary.final_eval_accuracy,
      FormatDuration(summary.wall_seconds), summary.checkpoint_dir);
  return summary;
}

absl::StatusOr<double> EvaluateJob(const JobConfig& config) {
  FUSIONRL_RETURN_IF_ERROR(ValidateJobConfig(config));
  FUSIONRL_ASSIGN_OR_RETURN(JobContext ctx, PrepareJob(config, ""));
  FUSIONRL_ASSIGN_OR_RETURN(
      EvalResult ev,
      EvaluateGreedy(*ctx.policy, ctx, config.rollout.max_new_tokens));
  return ev.accuracy;
}

}  // namespace fusionrl
