#include "cli/bench/bench_rollout_cli.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/bench/bench_common.h"
#include "cli/common/child_process.h"
#include "cli/common/exit_codes.h"
#include "core/status_macros.h"
#include "engine/jobs/job_setup.h"
#include "engine/train/memory_accounting.h"
#include "engine/model/model.h"
#include "engine/kernels/op_counter.h"
#include "engine/rollout/rollout.h"
#include "engine/rollout/sample.h"
#include "engine/train/trainer.h"
#include "fusionrl/config.h"
#include "fusionrl/tokenizer.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

#ifndef FUSIONRL_SOURCE_DIR
#define FUSIONRL_SOURCE_DIR ""
#endif

namespace fusionrl::cli {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

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
    const auto t0 = Clock::now();
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
      auto t0 = Clock::now();
      auto out = engine_->Generate(prompts, sampling_, config_.seed + it);
      if (!out.ok()) return out.status();
      const double r = Since(t0);
      const DecodeStats& st = engine_->last_stats();
      std::vector<Sample> samples = ToSamples(prompts, *out, s.tokens);
      t0 = Clock::now();
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
      auto t0 = Clock::now();
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
      t0 = Clock::now();
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

// One engine (fused, composite or static), measured in this process;
// prints its JSON.
int MeasureHere(const BenchRolloutArgs& args, const std::string& name) {
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

absl::StatusOr<std::string> FindReferenceScript(const std::string& given) {
  std::vector<std::string> candidates;
  if (!given.empty()) {
    candidates.push_back(given);
  } else {
    if (auto self = SelfExecutable(); self.ok()) {
      const auto dir = std::filesystem::path(*self).parent_path();
      candidates.push_back(
          (dir / "../share/fusionrl/rollout_reference.py").string());
    }
    if (std::string(FUSIONRL_SOURCE_DIR).size() > 0) {
      candidates.push_back(std::string(FUSIONRL_SOURCE_DIR) +
                           "/scripts/rollout_reference.py");
    }
  }
  for (const auto& c : candidates) {
    if (std::filesystem::exists(c)) return c;
  }
  return absl::NotFoundError(absl::StrCat(
      "--reference-script: rollout_reference.py not found (looked at ",
      candidates.empty() ? std::string("nothing")
                         : absl::StrJoin(candidates, ", "),
      "); pass its path, or leave 'python' out of --engines"));
}

std::vector<std::string> PythonArgv(const BenchRolloutArgs& args,
                                    const std::string& script,
                                    const JobConfig& c, int vocab) {
  const ModelConfig& m = c.model;
  std::vector<std::string> a = {args.python,
                                script,
                                "--vocab",
                                std::to_string(vocab),
                                "--d-model",
                                std::to_string(m.d_model),
                                "--n-layers",
                                std::to_string(m.n_layers),
                                "--n-heads",
                                std::to_string(m.n_heads),
                                "--n-kv-heads",
                                std::to_string(m.n_kv_heads),
                                "--head-dim",
                                std::to_string(m.head_dim),
                                "--d-ff",
                                std::to_string(m.d_ff),
                                "--max-seq-len",
                                std::to_string(m.max_seq_len),
                                "--rope-theta",
                                absl::StrCat(m.rope_theta),
                                "--prompts",
                                std::to_string(c.rollout.prompts_per_step),
                                "--group-size",
                                std::to_string(c.rollout.group_size),
                                "--prompt-len",
                                std::to_string(args.prompt_len),
                                "--max-new-tokens",
                                std::to_string(c.rollout.max_new_tokens),
                                "--temperature",
                                absl::StrCat(c.rollout.temperature),
                                "--micro-batch-size",
                                std::to_string(c.optim.micro_batch_size),
                                "--lr",
                                absl::StrCat(c.optim.lr),
                                "--threads",
                                std::to_string(c.num_threads),
                                "--iterations",
                                std::to_string(args.iterations),
                                "--seed",
                                std::to_string(c.seed)};
  if (m.tie_embeddings) a.push_back("--tie-embeddings");
  return a;
}

}  // namespace

CLI::App* AddBenchRolloutCommand(CLI::App& app, BenchRolloutArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "bench-rollout",
      "rollout and synchronous-step tokens/s of the engine next to a "
      "PyTorch-Python loop of the same shape; JSON out");
  cmd->add_option("config", args.config_path,
                  "job YAML (its model, rollout "
                  "and optim sections give the shape)")
      ->required();
  cmd->add_option("--engines", args.engines,
                  "comma-separated: fused, composite, static, python (default "
                  "fused,composite,python)");
  cmd->add_option("--repeats", args.repeats,
                  "fresh-process measurements per engine (default 3)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--iterations", args.iterations,
                  "timed steps per measurement, after one warm-up (default 5)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--prompt-len", args.prompt_len, "prompt tokens (default 12)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--stop-ids", args.stop_ids,
                  "C++ engines: stop at the N lowest token ids but pad, so "
                  "response lengths spread (default 0: every response is "
                  "max_new_tokens long, as in the Python loop)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--cross-steps", args.cross_steps,
                  "C++ engines: also time K steps' rollouts in one engine "
                  "call (slots refilled across steps) against K calls "
                  "(default 1: off)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--python", args.python,
                  "interpreter with torch (default /usr/bin/python3)");
  cmd->add_option("--reference-script", args.reference_script,
                  "rollout_reference.py (default: the installed or source "
                  "tree's)");
  cmd->add_option("--timeout", args.timeout_seconds,
                  "seconds per measurement (default 900)")
      ->check(CLI::Range(10, 86400));
  cmd->add_option("--out", args.out, "write the JSON here (default stdout)");
  cmd->add_option("--set", args.overrides,
                  "override a config key: key.path=value (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--measure", args.measure,
                  "internal: measure one engine (fused|composite|static) here")
      ->group("");
  return cmd;
}

namespace {

// --engines, checked: known names, none twice.
absl::StatusOr<std::vector<std::string>> ParseEngines(const std::string& text) {
  std::vector<std::string> engines;
  for (const absl::string_view e : absl::StrSplit(text, ',')) {
    const std::string name(e);
    if (name != "fused" && name != "composite" && name != "static" &&
        name != "python") {
      return absl::InvalidArgumentError(
          absl::StrCat("--engines: unknown engine '", name,
                       "' (fused, composite, static, python)"));
    }
    if (std::find(engines.begin(), engines.end(), name) != engines.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--engines: '", name, "' is listed twice"));
    }
    engines.push_back(name);
  }
  return engines;
}

// The vocabulary the prompts are drawn from (model.vocab_size, else the
// tokenizer's), after checking that the shape fits the model and that
// --stop-ids leaves a token to sample.
absl::StatusOr<int> CheckedVocab(const BenchRolloutArgs& args,
                                 const JobConfig& config) {
  if (args.prompt_len + config.rollout.max_new_tokens >
      config.model.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prompt-len ", args.prompt_len, " + rollout.max_new_tokens ",
        config.rollout.max_new_tokens, " exceeds model.max_seq_len ",
        config.model.max_seq_len));
  }
  FUSIONRL_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                            LoadJobTokenizer(config.model));
  const int vocab = config.model.vocab_size > 0 ? config.model.vocab_size
                                                : tokenizer->vocab_size();
  if (args.stop_ids >= vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stop-ids ", args.stop_ids,
        " leaves no token to sample (the vocabulary has ", vocab, " ids)"));
  }
  return vocab;
}

// rollout_reference.py when 'python' is among the engines, else "".
absl::StatusOr<std::string> PythonScript(
    const BenchRolloutArgs& args, const std::vector<std::string>& engines) {
  if (std::find(engines.begin(), engines.end(), "python") == engines.end()) {
    return std::string();
  }
  if (args.stop_ids > 0) {
    return absl::InvalidArgumentError(
        "--stop-ids: the Python loop samples max_new_tokens tokens for "
        "every response; leave 'python' out of --engines");
  }
  return FindReferenceScript(args.reference_script);
}

// What the measurements run on: the config, its vocabulary, this binary
// and the Python reference.
struct RolloutBenchPlan {
  std::vector<std::string> engines;
  JobConfig config;
  int vocab = 0;
  std::string script;  // "" without 'python'
  std::string self;
};

absl::StatusOr<RolloutBenchPlan> PlanRolloutBench(
    const BenchRolloutArgs& args) {
  RolloutBenchPlan p;
  FUSIONRL_ASSIGN_OR_RETURN(p.engines, ParseEngines(args.engines));
  FUSIONRL_ASSIGN_OR_RETURN(p.config,
                            LoadBenchConfig(args.config_path, args.overrides));
  FUSIONRL_ASSIGN_OR_RETURN(p.vocab, CheckedVocab(args, p.config));
  FUSIONRL_ASSIGN_OR_RETURN(p.script, PythonScript(args, p.engines));
  FUSIONRL_ASSIGN_OR_RETURN(p.self, SelfExecutable());
  return p;
}

// The command line of one measurement of engine `e` in a fresh process.
std::vector<std::string> MeasureArgv(const BenchRolloutArgs& args,
                                     const RolloutBenchPlan& p,
                                     const std::string& e) {
  if (e == "python") return PythonArgv(args, p.script, p.config, p.vocab);
  std::vector<std::string> argv = {p.self,
                                   "bench-rollout",
                                   args.config_path,
                                   "--measure",
                                   e,
                                   "--iterations",
                                   std::to_string(args.iterations),
                                   "--prompt-len",
                                   std::to_string(args.prompt_len),
                                   "--stop-ids",
                                   std::to_string(args.stop_ids),
                                   "--cross-steps",
                                   std::to_string(args.cross_steps)};
  for (const auto& o : args.overrides) {
    argv.push_back("--set");
    argv.push_back(o);
  }
  return argv;
}

// One engine's measurements, over the repeats.
struct EngineRuns {
  std::vector<double> rollout, step;
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
};

// args.repeats rounds, each engine once a round, in --engines order.
absl::StatusOr<std::map<std::string, EngineRuns>> RunMeasurements(
    const BenchRolloutArgs& args, const RolloutBenchPlan& p) {
  std::map<std::string, EngineRuns> acc;
  for (int r = 1; r <= args.repeats; ++r) {
    for (const std::string& e : p.engines) {
      const std::vector<std::string> argv = MeasureArgv(args, p, e);
      spdlog::info("bench-rollout: {} run {}/{}", e, r, args.repeats);
      absl::StatusOr<nlohmann::ordered_json> j =
          RunJsonChild(argv, args.timeout_seconds);
      if (!j.ok()) {
        return absl::Status(
            j.status().code(),
            absl::StrCat("bench-rollout: ", e, ": ", j.status().message()));
      }
      EngineRuns& a = acc[e];
      a.rollout.push_back(j->value("rollout_tokens_per_second", 0.0));
      a.step.push_back(j->value("step_tokens_per_second", 0.0));
      a.runs.push_back(*j);
    }
  }
  return acc;
}

// The result: the shape, each engine's medians and runs, and the ratios
// between the engines measured.
nlohmann::ordered_json RolloutBenchResult(
    const BenchRolloutArgs& args, const RolloutBenchPlan& p,
    std::map<std::string, EngineRuns>& acc) {
  const ModelConfig& m = p.config.model;
  nlohmann::ordered_json result;
  result["config"] = args.config_path;
  result["shape"] = {{"vocab", p.vocab},
                     {"d_model", m.d_model},
                     {"n_layers", m.n_layers},
                     {"n_heads", m.n_heads},
                     {"d_ff", m.d_ff},
                     {"prompts", p.config.rollout.prompts_per_step},
                     {"group_size", p.config.rollout.group_size},
                     {"prompt_len", args.prompt_len},
                     {"max_new_tokens", p.config.rollout.max_new_tokens},
                     {"threads", p.config.num_threads}};
  result["repeats"] = args.repeats;
  result["iterations"] = args.iterations;
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const std::string& e : p.engines) {
    const EngineRuns& a = acc[e];
    out[e] = {{"median_rollout_tokens_per_second", Median(a.rollout)},
              {"median_step_tokens_per_second", Median(a.step)},
              {"runs", a.runs}};
  }
  result["engines"] = out;
  nlohmann::ordered_json ratios = nlohmann::ordered_json::object();
  for (const auto& [num, den] :
       {std::pair<std::string, std::string>{"fused", "python"},
        {"composite", "python"},
        {"fused", "composite"},
        {"composite", "static"}}) {
    if (!acc.count(num) || !acc.count(den)) continue;
    ratios[num + "/" + den] = {
        {"rollout", Median(acc[num].rollout) / Median(acc[den].rollout)},
        {"step", Median(acc[num].step) / Median(acc[den].step)}};
  }
  result["ratios"] = ratios;
  return result;
}

}  // namespace

int RunBenchRollout(const BenchRolloutArgs& args) {
  if (!args.measure.empty()) {
    if (args.measure != "fused" && args.measure != "composite" &&
        args.measure != "static") {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--measure: '", args.measure, "' (fused|composite|static)")));
    }
    return MeasureHere(args, args.measure);
  }
  absl::StatusOr<RolloutBenchPlan> plan = PlanRolloutBench(args);
  if (!plan.ok()) return Fail(plan.status());
  absl::StatusOr<std::map<std::string, EngineRuns>> acc =
      RunMeasurements(args, *plan);
  if (!acc.ok()) return Fail(acc.status());
  return WriteBenchResult(RolloutBenchResult(args, *plan, *acc), args.out);
}

}  // namespace fusionrl::cli
