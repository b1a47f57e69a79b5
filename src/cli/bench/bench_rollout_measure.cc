// MeasureRolloutEngine (bench_rollout_measure.h): one engine's rollout and
// training steps timed in this process.
#include "cli/bench/bench_rollout_measure.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cli/bench/bench_common.h"
#include "cli/common/child_process.h"
#include "cli/common/exit_codes.h"
#include "core/clock.h"
#include "core/status_macros.h"
#include "engine/jobs/job_setup.h"
#include "engine/kernels/op_counter.h"
#include "engine/model/model.h"
#include "engine/rollout/rollout.h"
#include "engine/rollout/sample.h"
#include "engine/train/memory_accounting.h"
#include "engine/train/trainer.h"
#include "fusionrl/config.h"
#include "fusionrl/tokenizer.h"
#include "nlohmann/json.hpp"

namespace fusionrl::cli {
namespace {

// The monotonic clock's now, and the seconds from `t0` (one of those) to
// now: the measured intervals.
absl::Time Now() { return RealClock().MonotonicNow(); }
double Since(absl::Time t0) { return RealClock().SecondsSince(t0); }

// Ops and allocations of one Generate() call.
struct GenerateCost {
  int64_t ops = 0, allocations = 0, decode_steps = 0, prefill_rows = 0;
};

absl::StatusOr<GenerateCost> CountGenerate(
    RolloutEngine& engine, const std::vector<std::vector<int>>& prompts,
    const SamplingParams& params, c10::Device device) {
  GenerateCost cost;
  ScopedAllocationCounter allocations(device);
  {
    OpCounter ops;
    FUSIONRL_RETURN_IF_ERROR(engine.Generate(prompts, params, 99).status());
    cost.ops = ops.count();
  }
  cost.allocations = allocations.allocations();
  cost.decode_steps = engine.last_stats().decode_steps;
  cost.prefill_rows = engine.last_stats().prefill_rows;
  return cost;
}

// This machine's sgemm at the job's threads: a 512^3 float matmul, median
// GFLOP/s of 5 after a warm-up (the figure the training step is put next
// to).
double SgemmGflops() {
  const auto a = at::randn({512, 512}), b = at::randn({512, 512});
  auto c = at::empty({512, 512});
  std::vector<double> g;
  for (int i = 0; i < 6; ++i) {
    const auto t0 = Now();
    at::mm_out(c, a, b);
    const double s = Since(t0);
    if (i > 0) g.push_back(2.0 * 512 * 512 * 512 / s / 1e9);
  }
  return Median(g);
}

// Multiply-adds x 2 of one training forward of `rows` sequences of `p`
// prompt and `r` response positions, as the trainer computes it: every
// projection and the feed-forward at every position in every layer but the
// last; in a dense policy's last layer the keys and values at every
// position and the rest only at the r + 1 positions from the last prompt
// token on (PolicyModel::ForwardHidden's window); the attention's two
// T x T products per query (the composite path computes the full square);
// the LM head at the r response positions.
double TrainForwardFlops(const ModelConfig& m, int vocab, int64_t rows,
                         int64_t p, int64_t r) {
  const double d = m.d_model;
  const double head_dim =
      m.head_dim > 0 ? m.head_dim : static_cast<double>(m.d_model) / m.n_heads;
  const double q = m.n_heads * head_dim;
  const double kv = (m.n_kv_heads > 0 ? m.n_kv_heads : m.n_heads) * head_dim;
  const double t = static_cast<double>(p + r);
  const double kv_proj = 2 * (2 * d * kv);
  const double rest = 2 * (d * q + q * d + 3 * d * m.d_ff) + 4 * t * q;
  const ActivationConfig& a = m.activations;
  const SubBlockActivation kDefault = SubBlockActivation::kDefault;
  const bool window = m.moe_experts == 0 && p >= 1 &&
                      a.policy == ActivationPolicy::kKeep &&
                      a.attention == kDefault && a.mlp == kDefault &&
                      a.norm == kDefault && a.layers.empty();
  const double last_rows = window ? static_cast<double>(r + 1) : t;
  const double per_row = (m.n_layers - 1) * t * (kv_proj + rest) + t * kv_proj +
                         last_rows * rest + r * 2 * d * vocab;
  return static_cast<double>(rows) * per_row;
}

// The measured iterations' figures, one entry per iteration after the
// warm-up.
struct StepSeries {
  std::vector<double> rollout_s, train_s, prefill_s, model_s, sample_s, host_s,
      rows, train_flops;
  int64_t tokens = 0;  // response tokens of an iteration (the last one's)
};

// One engine (fused, composite or static) measured in this process: the
// job's policy, a rollout engine on that decode path, a trainer, and random
// prompts drawn from one seeded generator (so every engine sees the same
// prompts in the same order).
class RolloutMeasurement {
 public:
  RolloutMeasurement(const BenchRolloutArgs& args, std::string name)
      : args_(args), name_(std::move(name)), fused_(name_ == "fused") {}

  // Loads the config and builds the policy, the engine and the trainer.
  absl::Status Prepare() {
    absl::StatusOr<JobConfig> config =
        LoadBenchConfig(args_.config_path, args_.overrides);
    if (!config.ok()) return config.status();
    config_ = *std::move(config);
    config_.algorithm.kl_coef = 0;  // the Python loop has no reference policy
    // composite and static: the module graph's decode (with or without
    // prefix sharing and compaction) and the reference attention core.
    if (!fused_) config_.model.attention_kernel = AttentionKernel::kComposite;
    FUSIONRL_ASSIGN_OR_RETURN(ctx_, PrepareJob(config_, ""));
    PolicyModel& policy = *ctx_.policy;
    pad_ = ctx_.tokenizer->pad_id();
    // No stop id by default: every response is max_new_tokens long on both
    // sides. --stop-ids N: the N lowest ids but pad.
    std::vector<int> stops;
    for (int id = 0; static_cast<int>(stops.size()) < args_.stop_ids; ++id) {
      if (id != pad_) stops.push_back(id);
    }
    engine_ = std::make_unique<RolloutEngine>(policy, pad_, stops);
    engine_->set_decode_path(fused_ ? RolloutEngine::DecodePath::kFused
                             : name_ == "composite"
                                 ? RolloutEngine::DecodePath::kComposite
                                 : RolloutEngine::DecodePath::kStatic);
    FUSIONRL_ASSIGN_OR_RETURN(trainer_,
                              Trainer::Create(policy, nullptr, config_, pad_));
    sampling_.temperature = config_.rollout.temperature;
    sampling_.max_new_tokens = config_.rollout.max_new_tokens;
    const int vocab =
        std::min(ctx_.tokenizer->vocab_size(), policy.vocab_size());
    rng_.seed(config_.seed);
    token_ = std::uniform_int_distribution<int>(0, vocab - 1);
    return absl::OkStatus();
  }

  // args.iterations rollout + training steps after one warm-up.
  absl::StatusOr<StepSeries> MeasureSteps() {
    StepSeries s;
    for (int it = 0; it <= args_.iterations; ++it) {
      const auto prompts = MakePrompts();
      auto t0 = Now();
      auto out = engine_->Generate(prompts, sampling_, config_.seed + it);
      if (!out.ok()) return out.status();
      const double r = Since(t0);
      const DecodeStats& st = engine_->last_stats();
      std::vector<Sample> samples = ToSamples(prompts, *out, s.tokens);
      t0 = Now();
      auto stats = trainer_->Step(samples);
      if (!stats.ok()) return stats.status();
      const double t = Since(t0);
      if (it == 0) continue;  // warm-up
      s.train_flops.push_back(StepTrainFlops(stats->computed_tokens));
      s.rollout_s.push_back(r);
      s.train_s.push_back(t);
      s.prefill_s.push_back(st.prefill_seconds);
      s.model_s.push_back(st.model_seconds);
      s.sample_s.push_back(st.sample_seconds);
      s.host_s.push_back(st.host_seconds);
      s.rows.push_back(static_cast<double>(st.rows_computed));
    }
    return s;
  }

  // Continuous batching across steps: K steps' prompts in one call, each
  // sequence with the key its own step's call gives it, one step's worth
  // of slots; against the K calls one after another. Alternating. null
  // unless --cross-steps > 1.
  absl::StatusOr<nlohmann::ordered_json> MeasureCrossSteps() {
    if (args_.cross_steps <= 1) return nlohmann::ordered_json(nullptr);
    const int k_steps = args_.cross_steps;
    std::vector<double> merged_s, separate_s;
    int64_t merged_steps = 0, separate_steps = 0;
    for (int it = 0; it <= args_.iterations; ++it) {
      std::vector<std::vector<std::vector<int>>> steps;
      std::vector<std::vector<int>> all;
      std::vector<SequenceKey> keys;
      for (int k = 0; k < k_steps; ++k) {
        steps.push_back(MakePrompts());
        const uint64_t seed = config_.seed + 1000 + it * k_steps + k;
        for (size_t j = 0; j < steps.back().size(); ++j) {
          keys.push_back({seed, static_cast<int64_t>(j)});
        }
        all.insert(all.end(), steps.back().begin(), steps.back().end());
      }
      auto t0 = Now();
      int64_t sep = 0;
      for (int k = 0; k < k_steps; ++k) {
        auto out = engine_->Generate(steps[k], sampling_,
                                     config_.seed + 1000 + it * k_steps + k);
        if (!out.ok()) return out.status();
        sep += engine_->last_stats().decode_steps;
      }
      const double separate = Since(t0);
      const int64_t configured = engine_->max_batch();
      engine_->set_max_batch(static_cast<int64_t>(steps[0].size()));
      t0 = Now();
      auto merged = engine_->Generate(all, sampling_, keys);
      const double together = Since(t0);
      engine_->set_max_batch(configured);
      if (!merged.ok()) return merged.status();
      if (it == 0) continue;  // warm-up
      merged_s.push_back(together);
      separate_s.push_back(separate);
      merged_steps = engine_->last_stats().decode_steps;
      separate_steps = sep;
    }
    return nlohmann::ordered_json{
        {"steps", k_steps},
        {"merged_seconds", Median(merged_s)},
        {"separate_seconds", Median(separate_s)},
        {"separate_over_merged", Median(separate_s) / Median(merged_s)},
        {"merged_decode_steps", merged_steps},
        {"separate_decode_steps", separate_steps}};
  }

  // Ops and allocations per decode step (a full Generate minus one that
  // stops after the prefill's token, over the decode steps between them),
  // then the JSON of the whole measurement.
  absl::StatusOr<nlohmann::ordered_json> Report(
      const StepSeries& s, const nlohmann::ordered_json& cross) {
    const auto prompts = MakePrompts();
    SamplingParams one = sampling_;
    one.max_new_tokens = 1;
    auto full = CountGenerate(*engine_, prompts, sampling_, ctx_.device);
    auto base = CountGenerate(*engine_, prompts, one, ctx_.device);
    if (!full.ok()) return full.status();
    if (!base.ok()) return base.status();
    const double steps =
        std::max<int64_t>(1, full->decode_steps - base->decode_steps);
    const double r = Median(s.rollout_s), t = Median(s.train_s);
    const double sgemm = SgemmGflops();
    const double train_gflops = Median(s.train_flops) / t / 1e9;
    return nlohmann::ordered_json{
        {"engine", name_},
        {"fused_path", engine_->fused()},
        {"attention_kernel",
         AttentionKernelName(config_.model.attention_kernel)},
        {"threads", config_.num_threads},
        {"tokens_per_iteration", s.tokens},
        {"rollout_seconds", r},
        {"train_seconds", t},
        {"rollout_tokens_per_second", s.tokens / r},
        {"step_tokens_per_second", s.tokens / (r + t)},
        {"iterations", args_.iterations},
        {"train_gflops", train_gflops},
        {"sgemm_gflops", sgemm},
        {"train_fraction_of_sgemm", sgemm > 0 ? train_gflops / sgemm : 0},
        {"decode",
         {{"prefill_rows", full->prefill_rows},
          {"prefill_seconds", Median(s.prefill_s)},
          {"model_seconds", Median(s.model_s)},
          {"sample_seconds", Median(s.sample_s)},
          {"host_seconds", Median(s.host_s)},
          {"decode_steps", full->decode_steps},
          {"rows_computed", Median(s.rows)},
          {"ops_per_decode_step", (full->ops - base->ops) / steps},
          {"allocations_per_decode_step",
           (full->allocations - base->allocations) / steps},
          {"ops_prefill", base->ops},
          {"allocations_prefill", base->allocations}}},
        {"cross_steps", cross}};
  }

 private:
  // One step's prompts: prompts_per_step random prompts (no pad token),
  // each group_size times.
  std::vector<std::vector<int>> MakePrompts() {
    const RolloutConfig& rc = config_.rollout;
    std::vector<std::vector<int>> prompts;
    for (int p = 0; p < rc.prompts_per_step; ++p) {
      std::vector<int> ids(args_.prompt_len);
      for (int& t : ids) {
        do t = token_(rng_);
        while (t == pad_);
      }
      for (int g = 0; g < rc.group_size; ++g) prompts.push_back(ids);
    }
    return prompts;
  }

  // The rollout's responses as training samples with a coin-flip reward;
  // `tokens` becomes their response tokens.
  std::vector<Sample> ToSamples(const std::vector<std::vector<int>>& prompts,
                                std::vector<Completion>& out, int64_t& tokens) {
    std::vector<Sample> samples(prompts.size());
    std::bernoulli_distribution reward(0.5);
    tokens = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Sample& s = samples[i];
      s.group_id = i / config_.rollout.group_size;
      s.problem_index = s.group_id;
      s.prompt_ids = prompts[i];
      s.response_ids = std::move(out[i].tokens);
      s.behaviour_logp = std::move(out[i].logp);
      s.reward = reward(rng_) ? 1.0 : 0.0;
      tokens += static_cast<int64_t>(s.response_ids.size());
    }
    return samples;
  }

  // Forward + backward = 3 forwards' multiply-adds. Without stop ids every
  // sequence has args.prompt_len + max_new_tokens positions; with them
  // lengths vary and the figure is not counted (0).
  double StepTrainFlops(int64_t computed_tokens) const {
    const int max_new = config_.rollout.max_new_tokens;
    const int64_t len = args_.prompt_len + max_new;
    return args_.stop_ids > 0
               ? 0.0
               : 3.0 * TrainForwardFlops(
                           config_.model, ctx_.policy->vocab_size(),
                           computed_tokens / len, args_.prompt_len, max_new);
  }

  const BenchRolloutArgs& args_;
  const std::string name_;
  const bool fused_;
  JobConfig config_;
  JobContext ctx_;
  int pad_ = 0;
  std::unique_ptr<RolloutEngine> engine_;
  std::unique_ptr<Trainer> trainer_;
  SamplingParams sampling_;
  std::mt19937_64 rng_;
  std::uniform_int_distribution<int> token_;
};

}  // namespace

int MeasureRolloutEngine(const BenchRolloutArgs& args,
                         const std::string& name) {
  LogToStderr();
  RolloutMeasurement m(args, name);
  if (absl::Status s = m.Prepare(); !s.ok()) return Fail(s);
  absl::StatusOr<StepSeries> steps = m.MeasureSteps();
  if (!steps.ok()) return Fail(steps.status());
  absl::StatusOr<nlohmann::ordered_json> cross = m.MeasureCrossSteps();
  if (!cross.ok()) return Fail(cross.status());
  absl::StatusOr<nlohmann::ordered_json> j = m.Report(*steps, *cross);
  if (!j.ok()) return Fail(j.status());
  std::cout << j->dump() << std::endl;
  return kExitOk;
}

}  // namespace fusionrl::cli
