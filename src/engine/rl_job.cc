// The synchronous on-policy RL loop (`fusionrl run`).
//
// Each step: take prompts_per_step training problems from the task's data
// cursor, sample group_size responses per prompt with the current policy,
// score them, and train on the batch. Every sample records the policy
// version that generated it; in this loop behaviour version == trainer
// version at training time (staleness 0).
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/metrics.h"
#include "core/seed.h"
#include "core/status_macros.h"
#include "engine/checkpoint.h"
#include "engine/grad_sync.h"
#include "engine/job_common.h"
#include "engine/rollout.h"
#include "engine/sample.h"
#include "engine/trainer.h"
#include "fusionrl/job.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace fusionrl {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kRolloutStream = 0x726f6c6c;  // "roll"

// Keeps the metrics records of steps <= `last_step` (a resumed run rewrites
// the steps after its checkpoint).
absl::Status TruncateMetrics(const std::string& path, int64_t last_step) {
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() <= last_step) {
      kept += line + "\n";
    }
  }
  return WriteFileAtomic(path, kept);
}

}  // namespace

// One card's share of the RL loop. Every card holds a replica of the policy,
// samples its share of each step's prompt groups and trains data-parallel
// with the others through `sync` (null for a single card). Card 0 also
// evaluates, logs, checkpoints and writes the summary; the other cards
// return an empty summary.
absl::StatusOr<JobSummary> RunCard(const JobConfig& config,
                                   const RunOptions& options, int rank,
                                   GradientSync* sync) {
  const auto job_start = Clock::now();
  const int world = sync != nullptr ? sync->world_size() : 1;
  const bool lead = rank == 0;
  const std::string& out = config.output_dir;
  FUSIONRL_ASSIGN_OR_RETURN(JobContext ctx,
                            PrepareJob(config, lead ? out : std::string()));
  // The cards share the job's threads.
  at::set_num_threads(std::max(1, config.num_threads / world));
  PolicyModel& policy = *ctx.policy;
  // The reference is the starting policy (init_checkpoint), also on resume.
  std::unique_ptr<PolicyModel> reference;
  if (config.algorithm.kl_coef > 0) reference = policy.CloneFrozen();
  FUSIONRL_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                            Trainer::Create(policy, reference.get(), config,
                                            ctx.tokenizer->pad_id(), sync));
  RolloutEngine rollout(policy, ctx.tokenizer->pad_id(),
                        ctx.tokenizer->eos_id());
  const std::string checkpoints_dir = out + "/checkpoints";
  const std::string metrics_path = out + "/metrics.jsonl";

  JobSummary summary;
  summary.kind = "rl";
  summary.summary_path = out + "/summary.json";
  double last_eval = 0;
  double loop_seconds = 0;  // rollout + train time, eval excluded
  uint64_t cursor = 0;
  int first_step = 1;
  const int total = config.run.total_steps;

  if (lead) {
    spdlog::info(
        "[{}] policy {} parameters on {} x {} card(s), task {} ({} "
        "eval problems)",
        config.name, policy.num_parameters(), world, ctx.device.str(),
        ctx.task->name(), ctx.task->eval_set().size());
  }
  if (options.resume) {
    FUSIONRL_ASSIGN_OR_RETURN(std::string dir,
                              FindLatestCheckpoint(checkpoints_dir));
    FUSIONRL_ASSIGN_OR_RETURN(CheckpointMeta meta,
                              ReadCheckpoint(dir, policy, trainer.get()));
    if (meta.kind != "rl") {
      return absl::FailedPreconditionError(
          absl::StrCat("resume: '", dir, "' is a ", meta.kind,
                       " checkpoint, not an RL one"));
    }
    trainer->set_version(meta.policy_version);
    cursor = meta.data_cursor;
    first_step = static_cast<int>(meta.step) + 1;
    summary.resumed_from_step = meta.step;
    summary.initial_eval_accuracy = meta.initial_eval_accuracy;
    summary.rollout_tokens = meta.rollout_tokens;
    last_eval = meta.last_eval_accuracy;
    loop_seconds = meta.loop_seconds;
    if (lead) {
      FUSIONRL_RETURN_IF_ERROR(TruncateMetrics(metrics_path, meta.step));
      spdlog::info("[{}] resuming from {} (step {}, policy version {})",
                   config.name, dir, meta.step, meta.policy_version);
    }
  } else if (lead) {
    FUSIONRL_ASSIGN_OR_RETURN(
        EvalResult initial,
        EvaluateGreedy(policy, ctx, config.rollout.max_new_tokens));
    spdlog::info("[{}] initial eval accuracy {:.3f} ({:.1f}s)", config.name,
                 initial.accuracy, initial.seconds);
    summary.initial_eval_accuracy = initial.accuracy;
    last_eval = initial.accuracy;
  }
  std::unique_ptr<MetricsLog> metrics;
  if (lead) {
    FUSIONRL_ASSIGN_OR_RETURN(
        metrics, MetricsLog::Open(metrics_path, /*truncate=*/!options.resume));
  }

  const auto& rc = config.rollout;
  SamplingParams sampling;
  sampling.temperature = rc.temperature;
  sampling.top_k = rc.top_k;
  sampling.top_p = rc.top_p;
  sampling.max_new_tokens = rc.max_new_tokens;

  auto checkpoint = [&](const std::string& name, int64_t step) {
    CheckpointMeta meta{"rl",        config.name,
                        step,        trainer->version(),
                        cursor,      summary.initial_eval_accuracy,
                        last_eval,   summary.rollout_tokens,
                        loop_seconds};
    summary.checkpoint_dir = checkpoints_dir + "/" + name;
    return WriteCheckpoint(summary.checkpoint_dir, policy, trainer.get(), meta);
  };

  int last_step = first_step - 1;
  for (int step = first_step; step <= total; ++step) {
    const auto t0 = Clock::now();
    // 1. Prompts for this step: prompts_per_step problems, each repeated
    //    group_size times (group-major layout).
    std::vector<Sample> samples;
    std::vector<Problem> problems;
    std::vector<std::vector<int>> prompts;
    //    This card takes its slice of the step's groups; every card advances
    //    the cursor past the whole step.
    const int groups_per_card = rc.prompts_per_step / world;
    const uint64_t first_group =
        cursor + static_cast<uint64_t>(rank) * groups_per_card;
    cursor += rc.prompts_per_step;
    samples.reserve(groups_per_card * rc.group_size);
    for (int g = 0; g < groups_per_card; ++g) {
      const uint64_t index = first_group + g;
      problems.push_back(ctx.task->TrainProblem(index));
      FUSIONRL_ASSIGN_OR_RETURN(
          auto ids, EncodePrompt(*ctx.tokenizer, problems.back().prompt));
      for (int i = 0; i < rc.group_size; ++i) {
        Sample s;
        s.group_id = index;
        s.problem_index = index;
        s.prompt_ids = ids;
        s.behaviour_version = trainer->version();
        samples.push_back(std::move(s));
        prompts.push_back(ids);
      }
    }
    // 2. Rollout.
    uint64_t rollout_seed = MixSeed(MixSeed(config.seed, kRolloutStream), step);
    if (rank > 0) rollout_seed = MixSeed(rollout_seed, rank);
    FUSIONRL_ASSIGN_OR_RETURN(
        auto completions, rollout.Generate(prompts, sampling, rollout_seed));
    const double rollout_s = SecondsSince(t0);
    // 3. Score.
    int64_t step_tokens = 0, correct = 0, finished = 0;
    double reward_sum = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      Sample& s = samples[i];
      s.response_ids = std::move(completions[i].tokens);
      s.behaviour_logp = std::move(completions[i].logp);
      s.finished = completions[i].finished;
      const Verdict v =
          ctx.reward->Score(problems[i / rc.group_size],
                            DecodeResponse(*ctx.tokenizer, s.response_ids));
      s.reward = v.reward;
      s.correct = v.correct;
      reward_sum += v.reward;
      correct += v.correct;
      finished += s.finished;
      step_tokens += static_cast<int64_t>(s.response_ids.size());
    }
    // 4. Train. Staleness = trainer version - behaviour version of each
    //    sample at the moment it is trained on.
    int64_t max_staleness = 0;
    for (const Sample& s : samples) {
      max_staleness =
          std::max(max_staleness, trainer->version() - s.behaviour_version);
    }
    const auto t1 = Clock::now();
    FUSIONRL_ASSIGN_OR_RETURN(TrainStats ts, trainer->Step(samples));
    const double train_s = SecondsSince(t1);
    // Step totals over all cards; a stop request on any card stops all.
    const bool stop_here =
        options.stop_requested != nullptr &&
        options.stop_requested->load(std::memory_order_relaxed);
    std::vector<double> totals = {reward_sum,
                                  static_cast<double>(correct),
                                  static_cast<double>(finished),
                                  static_cast<double>(step_tokens),
                                  static_cast<double>(samples.size()),
                                  stop_here ? 1.0 : 0.0};
    FUSIONRL_RETURN_IF_ERROR(SumAcrossRanks(sync, totals));
    reward_sum = totals[0];
    correct = static_cast<int64_t>(totals[1]);
    finished = static_cast<int64_t>(totals[2]);
    step_tokens = static_cast<int64_t>(totals[3]);
    const bool stop = totals[5] > 0;
    loop_seconds += SecondsSince(t0);
    summary.rollout_tokens += step_tokens;
    last_step = step;
    if (!lead) {
      if (stop && step != total) break;
      continue;
    }

    const double n = totals[4];
    const double reward_mean = reward_sum / n;
    summary.final_train_reward = reward_mean;
    MetricRecord rec = {
        {"step", step},
        {"policy_version", static_cast<double>(trainer->version())},
        {"reward_mean", reward_mean},
        {"train_accuracy", correct / n},
        {"response_len_mean", step_tokens / n},
        {"finished_frac", finished / n},
        {"loss", ts.loss},
        {"pg_loss", ts.pg_loss},
        {"kl", ts.kl},
        {"entropy", ts.entropy},
        {"clip_frac", ts.clip_frac},
        {"grad_norm", ts.grad_norm},
        {"lr", ts.lr},
        {"advantage_abs_mean", ts.advantage_abs_mean},
        {"max_staleness", static_cast<double>(max_staleness)},
        {"rollout_tokens", static_cast<double>(step_tokens)},
        {"rollout_seconds", rollout_s},
        {"train_seconds", train_s},
        {"tokens_per_second", summary.rollout_tokens / loop_seconds}};
    const bool eval_now =
        (config.run.eval_every > 0 && step % config.run.eval_every == 0) ||
        step == total;
    if (eval_now) {
      FUSIONRL_ASSIGN_OR_RETURN(EvalResult ev,
                                EvaluateGreedy(policy, ctx, rc.max_new_tokens));
      last_eval = ev.accuracy;
      rec.push_back({"eval_accuracy", ev.accuracy});
      rec.push_back({"eval_seconds", ev.seconds});
    }
    FUSIONRL_RETURN_IF_ERROR(metrics->Append(rec));
    if (step % config.run.log_every == 0 || step == total || eval_now) {
      const double per_step = loop_seconds / step;
      spdlog::info(
          "[{}] step {}/{} | reward {:.3f} | acc {:.3f} | eval {:.3f} | "
          "len {:.1f} | kl {:.4f} | {} tok/s | ETA {}",
          config.name, step, total, reward_mean, correct / n, last_eval,
          step_tokens / n, ts.kl,
          FormatCount(summary.rollout_tokens / loop_seconds),
          FormatDuration(per_step * (total - step)));
    }
    if (stop && step != total) {
      spdlog::warn(
          "[{}] stop requested: checkpointing step {} and exiting; "
          "continue with --resume",
          config.name, step);
      summary.interrupted = true;
      FUSIONRL_RETURN_IF_ERROR(checkpoint(absl::StrCat("step_", step), step));
      break;
    }
    if (config.run.checkpoint_every > 0 &&
        step % config.run.checkpoint_every == 0 && step != total) {
      FUSIONRL_RETURN_IF_ERROR(checkpoint(absl::StrCat("step_", step), step));
    }
  }

  if (!lead) return JobSummary{};
  if (!summary.interrupted) {
    FUSIONRL_RETURN_IF_ERROR(checkpoint("final", last_step));
  }
  summary.final_eval_accuracy = last_eval;
  summary.steps = last_step;
  summary.policy_version = trainer->version();
  summary.tokens_per_second =
      loop_seconds > 0 ? summary.rollout_tokens / loop_seconds : 0;
  summary.wall_seconds = SecondsSince(job_start);
  FUSIONRL_RETURN_IF_ERROR(WriteSummary(summary));
  spdlog::info("[{}] done: eval accuracy {:.3f} -> {:.3f} in {} ({} tok/s)",
               config.name, summary.initial_eval_accuracy,
               summary.final_eval_accuracy,
               FormatDuration(summary.wall_seconds),
               FormatCount(summary.tokens_per_second));
  return summary;
}

absl::StatusOr<JobSummary> RunRlJob(const JobConfig& config,
                                    const RunOptions& options) {
  FUSIONRL_RETURN_IF_ERROR(ValidateJobConfig(config));
  const PlacementConfig& placement = config.placement;
  if (placement.mode != "colocated-sync") {
    return absl::FailedPreconditionError(
        absl::StrCat("placement.mode: '", placement.mode,
                     "' is not available in this "
                     "version; use colocated-sync"));
  }
  if (placement.super_nodes != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "placement.super_nodes: ", placement.super_nodes,
        " super nodes need "
        "the controller and workers, not available in this version; use 1"));
  }
  const int cards = placement.cards_per_super_node;
  if (config.rollout.prompts_per_step % cards != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("rollout.prompts_per_step: must be a multiple of "
                     "placement.cards_per_super_node (",
                     cards,
                     ") so every card trains on "
                     "the same number of prompt groups, got ",
                     config.rollout.prompts_per_step));
  }
  if (cards == 1) return RunCard(config, options, 0, nullptr);

  // Several cards: one thread each, data-parallel through c10d Gloo.
  FUSIONRL_ASSIGN_OR_RETURN(
      auto group,
      MakeLocalGlooGroup(cards,
                         absl::Seconds(config.run.collective_timeout_seconds)));
  std::vector<absl::Status> card_status(cards);
  std::vector<std::thread> threads;
  for (int r = 1; r < cards; ++r) {
    threads.emplace_back([&, r] {
      card_status[r] = RunCard(config, options, r, group[r].get()).status();
    });
  }
  absl::StatusOr<JobSummary> lead = RunCard(config, options, 0, group[0].get());
  for (auto& t : threads) t.join();
  if (!lead.ok()) return lead.status();
  for (int r = 1; r < cards; ++r) {
    if (!card_status[r].ok()) {
      return absl::Status(
          card_status[r].code(),
          absl::StrCat("card ", r, ": ", card_status[r].message()));
    }
  }
  return lead;
}

}  // namespace fusionrl
