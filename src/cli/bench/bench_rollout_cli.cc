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

// One engine (fused, composite or static), measured in this process;
// prints its JSON.
int MeasureHere(const BenchRolloutArgs& args, const std::string& name) {
  const bool fused = name == "fused";
  LogToStderr();
  absl::StatusOr<JobConfig> config =
      LoadBenchConfig(args.config_path, args.overrides);
  if (!config.ok()) return Fail(config.status());
  config->algorithm.kl_coef = 0;  // the Python loop has no reference policy
  // composite and static: the module graph's decode (with or without prefix
  // sharing and compaction) and the reference attention core.
  if (!fused) config->model.attention_kernel = AttentionKernel::kComposite;
  absl::StatusOr<JobContext> ctx = PrepareJob(*config, "");
  if (!ctx.ok()) return Fail(ctx.status());
  PolicyModel& policy = *ctx->policy;
  const int pad = ctx->tokenizer->pad_id();
  // No stop id by default: every response is max_new_tokens long on both
  // sides. --stop-ids N: the N lowest ids but pad.
  std::vector<int> stops;
  for (int id = 0; static_cast<int>(stops.size()) < args.stop_ids; ++id) {
    if (id != pad) stops.push_back(id);
  }
  RolloutEngine engine(policy, pad, stops);
  engine.set_decode_path(fused ? RolloutEngine::DecodePath::kFused
                         : name == "composite"
                             ? RolloutEngine::DecodePath::kComposite
                             : RolloutEngine::DecodePath::kStatic);
  auto trainer = Trainer::Create(policy, nullptr, *config, pad);
  if (!trainer.ok()) return Fail(trainer.status());
  const auto& rc = config->rollout;
  SamplingParams sampling;
  sampling.temperature = rc.temperature;
  sampling.max_new_tokens = rc.max_new_tokens;
  const int vocab = std::min(ctx->tokenizer->vocab_size(), policy.vocab_size());
  std::mt19937_64 rng(config->seed);
  std::uniform_int_distribution<int> token(0, vocab - 1);
  auto make_prompts = [&] {
    std::vector<std::vector<int>> prompts;
    for (int p = 0; p < rc.prompts_per_step; ++p) {
      std::vector<int> ids(args.prompt_len);
      for (int& t : ids) {
        do t = token(rng);
        while (t == pad);
      }
      for (int g = 0; g < rc.group_size; ++g) prompts.push_back(ids);
    }
    return prompts;
  };
  std::vector<double> rollout_s, train_s, prefill_s, model_s, sample_s, host_s,
      rows, train_flops;
  int64_t tokens = 0;
  for (int it = 0; it <= args.iterations; ++it) {
    const auto prompts = make_prompts();
    auto t0 = Clock::now();
    auto out = engine.Generate(prompts, sampling, config->seed + it);
    if (!out.ok()) return Fail(out.status());
    const double r = Since(t0);
    const DecodeStats& st = engine.last_stats();
    std::vector<Sample> samples(prompts.size());
    std::bernoulli_distribution reward(0.5);
    tokens = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Sample& s = samples[i];
      s.group_id = i / rc.group_size;
      s.problem_index = s.group_id;
      s.prompt_ids = prompts[i];
      s.response_ids = std::move((*out)[i].tokens);
      s.behaviour_logp = std::move((*out)[i].logp);
      s.reward = reward(rng) ? 1.0 : 0.0;
      tokens += static_cast<int64_t>(s.response_ids.size());
    }
    t0 = Clock::now();
    auto stats = (*trainer)->Step(samples);
    if (!stats.ok()) return Fail(stats.status());
    const double t = Since(t0);
    if (it == 0) continue;  // warm-up
    // Forward + backward = 3 forwards' multiply-adds. Without stop ids
    // every sequence has args.prompt_len + max_new_tokens positions; with
    // them lengths vary and the figure is not counted.
    const int64_t len = args.prompt_len + rc.max_new_tokens;
    train_flops.push_back(
        args.stop_ids > 0
            ? 0.0
            : 3.0 * TrainForwardFlops(config->model, policy.vocab_size(),
                                      stats->computed_tokens / len,
                                      args.prompt_len, rc.max_new_tokens));
    rollout_s.push_back(r);
    train_s.push_back(t);
    prefill_s.push_back(st.prefill_seconds);
    model_s.push_back(st.model_seconds);
    sample_s.push_back(st.sample_seconds);
    host_s.push_back(st.host_seconds);
    rows.push_back(static_cast<double>(st.rows_computed));
  }
  // Continuous batching across steps: K steps' prompts in one call, each
  // sequence with the key its own step's call gives it, one step's worth
  // of slots; against the K calls one after another. Alternating.
  nlohmann::ordered_json cross = nullptr;
  if (args.cross_steps > 1) {
    const int k_steps = args.cross_steps;
    std::vector<double> merged_s, separate_s;
    int64_t merged_steps = 0, separate_steps = 0;
    for (int it = 0; it <= args.iterations; ++it) {
      std::vector<std::vector<std::vector<int>>> steps;
      std::vector<std::vector<int>> all;
      std::vector<SequenceKey> keys;
      for (int k = 0; k < k_steps; ++k) {
        steps.push_back(make_prompts());
        const uint64_t seed = config->seed + 1000 + it * k_steps + k;
        for (size_t j = 0; j < steps.back().size(); ++j) {
          keys.push_back({seed, static_cast<int64_t>(j)});
        }
        all.insert(all.end(), steps.back().begin(), steps.back().end());
      }
      auto t0 = Clock::now();
      int64_t sep = 0;
      for (int k = 0; k < k_steps; ++k) {
        auto out = engine.Generate(steps[k], sampling,
                                   config->seed + 1000 + it * k_steps + k);
        if (!out.ok()) return Fail(out.status());
        sep += engine.last_stats().decode_steps;
      }
      const double separate = Since(t0);
      const int64_t configured = engine.max_batch();
      engine.set_max_batch(static_cast<int64_t>(steps[0].size()));
      t0 = Clock::now();
      auto merged = engine.Generate(all, sampling, keys);
      const double together = Since(t0);
      engine.set_max_batch(configured);
      if (!merged.ok()) return Fail(merged.status());
      if (it == 0) continue;  // warm-up
      merged_s.push_back(together);
      separate_s.push_back(separate);
      merged_steps = engine.last_stats().decode_steps;
      separate_steps = sep;
    }
    cross = {{"steps", k_steps},
             {"merged_seconds", Median(merged_s)},
             {"separate_seconds", Median(separate_s)},
             {"separate_over_merged", Median(separate_s) / Median(merged_s)},
             {"merged_decode_steps", merged_steps},
             {"separate_decode_steps", separate_steps}};
  }
  // Ops and allocations per decode step: a full Generate minus one that
  // stops after the prefill's token, over the decode steps between them.
  const auto prompts = make_prompts();
  SamplingParams one = sampling;
  one.max_new_tokens = 1;
  auto full = CountGenerate(engine, prompts, sampling, ctx->device);
  auto base = CountGenerate(engine, prompts, one, ctx->device);
  if (!full.ok()) return Fail(full.status());
  if (!base.ok()) return Fail(base.status());
  const double steps =
      std::max<int64_t>(1, full->decode_steps - base->decode_steps);
  const double r = Median(rollout_s), t = Median(train_s);
  const double sgemm = SgemmGflops();
  const double train_gflops = Median(train_flops) / t / 1e9;
  nlohmann::ordered_json j = {
      {"engine", name},
      {"fused_path", engine.fused()},
      {"attention_kernel", AttentionKernelName(config->model.attention_kernel)},
      {"threads", config->num_threads},
      {"tokens_per_iteration", tokens},
      {"rollout_seconds", r},
      {"train_seconds", t},
      {"rollout_tokens_per_second", tokens / r},
      {"step_tokens_per_second", tokens / (r + t)},
      {"iterations", args.iterations},
      {"train_gflops", train_gflops},
      {"sgemm_gflops", sgemm},
      {"train_fraction_of_sgemm", sgemm > 0 ? train_gflops / sgemm : 0},
      {"decode",
       {{"prefill_rows", full->prefill_rows},
        {"prefill_seconds", Median(prefill_s)},
        {"model_seconds", Median(model_s)},
        {"sample_seconds", Median(sample_s)},
        {"host_seconds", Median(host_s)},
        {"decode_steps", full->decode_steps},
        {"rows_computed", Median(rows)},
        {"ops_per_decode_step", (full->ops - base->ops) / steps},
        {"allocations_per_decode_step",
         (full->allocations - base->allocations) / steps},
        {"ops_prefill", base->ops},
        {"allocations_prefill", base->allocations}}},
      {"cross_steps", cross}};
  std::cout << j.dump() << std::endl;
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

int RunBenchRollout(const BenchRolloutArgs& args) {
  if (!args.measure.empty()) {
    if (args.measure != "fused" && args.measure != "composite" &&
        args.measure != "static") {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--measure: '", args.measure, "' (fused|composite|static)")));
    }
    return MeasureHere(args, args.measure);
  }
  std::vector<std::string> engines;
  for (const absl::string_view e : absl::StrSplit(args.engines, ',')) {
    const std::string name(e);
    if (name != "fused" && name != "composite" && name != "static" &&
        name != "python") {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--engines: unknown engine '", name,
                       "' (fused, composite, static, python)")));
    }
    if (std::find(engines.begin(), engines.end(), name) != engines.end()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--engines: '", name, "' is listed twice")));
    }
    engines.push_back(name);
  }
  absl::StatusOr<JobConfig> config =
      LoadBenchConfig(args.config_path, args.overrides);
  if (!config.ok()) return Fail(config.status());
  if (args.prompt_len + config->rollout.max_new_tokens >
      config->model.max_seq_len) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--prompt-len ", args.prompt_len, " + rollout.max_new_tokens ",
        config->rollout.max_new_tokens, " exceeds model.max_seq_len ",
        config->model.max_seq_len)));
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      LoadJobTokenizer(config->model);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  const int vocab = config->model.vocab_size > 0 ? config->model.vocab_size
                                                 : (*tokenizer)->vocab_size();
  if (args.stop_ids >= vocab) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--stop-ids ", args.stop_ids,
        " leaves no token to sample (the vocabulary has ", vocab, " ids)")));
  }
  std::string script;
  if (std::find(engines.begin(), engines.end(), "python") != engines.end()) {
    if (args.stop_ids > 0) {
      return Fail(absl::InvalidArgumentError(
          "--stop-ids: the Python loop samples max_new_tokens tokens for "
          "every response; leave 'python' out of --engines"));
    }
    absl::StatusOr<std::string> s = FindReferenceScript(args.reference_script);
    if (!s.ok()) return Fail(s.status());
    script = *s;
  }
  absl::StatusOr<std::string> self = SelfExecutable();
  if (!self.ok()) return Fail(self.status());

  struct Acc {
    std::vector<double> rollout, step;
    nlohmann::ordered_json runs = nlohmann::ordered_json::array();
  };
  std::map<std::string, Acc> acc;
  for (int r = 1; r <= args.repeats; ++r) {
    for (const std::string& e : engines) {
      std::vector<std::string> argv;
      if (e == "python") {
        argv = PythonArgv(args, script, *config, vocab);
      } else {
        argv = {*self,
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
      }
      spdlog::info("bench-rollout: {} run {}/{}", e, r, args.repeats);
      absl::StatusOr<nlohmann::ordered_json> j =
          RunJsonChild(argv, args.timeout_seconds);
      if (!j.ok()) {
        return Fail(absl::Status(
            j.status().code(),
            absl::StrCat("bench-rollout: ", e, ": ", j.status().message())));
      }
      Acc& a = acc[e];
      a.rollout.push_back(j->value("rollout_tokens_per_second", 0.0));
      a.step.push_back(j->value("step_tokens_per_second", 0.0));
      a.runs.push_back(*j);
    }
  }
  const ModelConfig& m = config->model;
  nlohmann::ordered_json result;
  result["config"] = args.config_path;
  result["shape"] = {{"vocab", vocab},
                     {"d_model", m.d_model},
                     {"n_layers", m.n_layers},
                     {"n_heads", m.n_heads},
                     {"d_ff", m.d_ff},
                     {"prompts", config->rollout.prompts_per_step},
                     {"group_size", config->rollout.group_size},
                     {"prompt_len", args.prompt_len},
                     {"max_new_tokens", config->rollout.max_new_tokens},
                     {"threads", config->num_threads}};
  result["repeats"] = args.repeats;
  result["iterations"] = args.iterations;
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const std::string& e : engines) {
    const Acc& a = acc[e];
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
  return WriteBenchResult(result, args.out);
}

}  // namespace fusionrl::cli
