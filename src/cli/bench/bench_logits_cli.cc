#include "cli/bench/bench_logits_cli.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "cli/bench/bench_common.h"
#include "cli/common/exit_codes.h"
#include "core/clock.h"
#include "core/status_macros.h"
#include "engine/jobs/job_setup.h"
#include "engine/model/model.h"
#include "engine/rollout/sample.h"
#include "engine/train/memory_accounting.h"
#include "engine/train/trainer.h"
#include "fusionrl/config.h"
#include "fusionrl/task.h"
#include "fusionrl/tokenizer.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace fusionrl::cli {
namespace {

// The entropy bonus of the PPO-like loss (algorithm.entropy_coef's order).
constexpr double kEntropyCoef = 0.01;
// Seed of the random response tokens.
constexpr uint64_t kResponseSeed = 1;

absl::StatusOr<std::vector<int64_t>> ParseChunks(const std::string& text) {
  std::vector<int64_t> chunks;
  for (const absl::string_view part : absl::StrSplit(text, ',')) {
    const absl::string_view item = absl::StripAsciiWhitespace(part);
    int64_t c = 0;
    if (!absl::SimpleAtoi(item, &c) || c < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--chunks: '", item,
          "' is not a chunk size (an integer >= 0 response positions; 0 = "
          "the materialised head)"));
    }
    if (std::find(chunks.begin(), chunks.end(), c) != chunks.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--chunks: ", c, " is listed twice"));
    }
    chunks.push_back(c);
  }
  if (chunks.front() != 0) {
    return absl::InvalidArgumentError(
        "--chunks: must start with 0 (the materialised head, the reference "
        "of every ratio and difference)");
  }
  return chunks;
}

// A micro-batch shaped like an RL one: `batch` sequences, each the encoded
// prompt (EncodeProblemPrompt) of a training problem followed by
// `response_len` random token ids below the vocabulary (seeded). P is the
// length of problem 0's prompt; only problems whose prompts have exactly
// that length are used (cycled if fewer than `batch` are found among the
// first problems), so every token of the batch is valid.
absl::StatusOr<CollatedBatch> RlShapedBatch(const JobContext& ctx, int batch,
                                            int response_len) {
  FUSIONRL_ASSIGN_OR_RETURN(
      std::vector<int> first,
      EncodeProblemPrompt(ctx, ctx.task->TrainProblem(0)));
  std::vector<std::vector<int>> prompts = {first};
  const uint64_t scan = std::max<uint64_t>(1000, 4 * batch);
  for (uint64_t i = 1; i < scan && static_cast<int>(prompts.size()) < batch;
       ++i) {
    FUSIONRL_ASSIGN_OR_RETURN(
        std::vector<int> ids,
        EncodeProblemPrompt(ctx, ctx.task->TrainProblem(i)));
    if (ids.size() == first.size()) prompts.push_back(std::move(ids));
  }
  const int vocab =
      std::min(ctx.tokenizer->vocab_size(), ctx.policy->vocab_size());
  std::mt19937_64 rng(kResponseSeed);
  std::uniform_int_distribution<int> token(0, vocab - 1);
  std::vector<Sample> samples(batch);
  for (int b = 0; b < batch; ++b) {
    samples[b].prompt_ids = prompts[b % prompts.size()];
    samples[b].response_ids.resize(response_len);
    for (int& t : samples[b].response_ids) t = token(rng);
    samples[b].behaviour_logp.assign(response_len, 0.0f);
  }
  return Collate(samples, ctx.tokenizer->pad_id(), ctx.device);
}

struct StepResult {
  int64_t peak_bytes = 0;  // allocated over forward + backward, at most
  int64_t held_bytes = 0;  // allocated and live at the end of forward
  double forward_seconds = 0;
  double backward_seconds = 0;
  at::Tensor logp;  // [B, R], detached
};

// One training step of the LM head and loss from zeroed gradients: the
// response tokens' log-probs and entropies with `chunk_tokens`, the loss
// -mean(logp) - kEntropyCoef * mean(entropy) over the response mask, and
// its backward, under an allocation counter on the policy's device.
absl::StatusOr<StepResult> Step(PolicyModel& policy, const CollatedBatch& batch,
                                double temperature, int64_t chunk_tokens) {
  StepResult r;
  try {
    for (at::Tensor p : policy.parameters()) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    at::AutoGradMode grad_on(true);
    ScopedAllocationCounter counter(policy.device());
    const absl::Time start = RealClock().MonotonicNow();
    ResponseTokenStats tok =
        ResponseTokenLogProbs(policy, batch, temperature, chunk_tokens,
                              /*with_entropy=*/true);
    const at::Tensor& mask = batch.response_mask;
    const at::Tensor denom = mask.sum();
    at::Tensor loss = -(tok.logp * mask).sum() / denom -
                      kEntropyCoef * (tok.entropy * mask).sum() / denom;
    loss.item<double>();  // waits for the device
    r.forward_seconds = RealClock().SecondsSince(start);
    r.held_bytes = counter.current_bytes();
    r.logp = tok.logp.detach();
    tok = ResponseTokenStats();
    const absl::Time back = RealClock().MonotonicNow();
    loss.backward();
    if (!policy.device().is_cpu()) {
      // Wait for the backward kernels (a host read syncs the stream).
      for (const at::Tensor& p : policy.parameters()) {
        if (p.grad().defined()) p.grad().sum().item<double>();
      }
    }
    r.backward_seconds = RealClock().SecondsSince(back);
    r.peak_bytes = counter.peak_bytes();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("bench-logits: chunk ",
                                            chunk_tokens, ": ",
                                            e.what_without_backtrace()));
  }
  return r;
}

struct ChunkRun {
  int64_t chunk = 0;
  std::vector<StepResult> steps;  // the timed repeats
  at::Tensor logp;                // of the warm-up step
  std::vector<at::Tensor> grads;  // after the warm-up step
};

// max over parameters of max|g - g0| / max|g0| (0 where g0 is all zero and
// g equals it).
double MaxRelativeGradDiff(const std::vector<at::Tensor>& g,
                           const std::vector<at::Tensor>& g0) {
  double worst = 0;
  for (size_t i = 0; i < g.size() && i < g0.size(); ++i) {
    const double diff = (g[i] - g0[i]).abs().max().item<double>();
    const double scale = g0[i].abs().max().item<double>();
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return worst;
}

}  // namespace

CLI::App* AddBenchLogitsCommand(CLI::App& app, BenchLogitsArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "bench-logits",
      "memory and time of the LM head + loss of a training step, chunked vs "
      "materialised, on an RL-shaped micro-batch; JSON out");
  cmd->add_option("config", args.config_path,
                  "job YAML (configs/hf-tiny.yaml: a 151,936-token vocabulary)")
      ->required();
  cmd->add_option("--chunks", args.chunks,
                  "comma-separated optim.logits_chunk_tokens settings, 0 "
                  "(materialised) first (default 0,128,512)");
  cmd->add_option("--repeats", args.repeats,
                  "timed steps per chunk setting (default 5)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--out", args.out, "write the JSON here (default stdout)");
  cmd->add_option("--set", args.overrides,
                  "override a config key: key.path=value (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  return cmd;
}

namespace {

// The policy and the RL-shaped micro-batch every setting's steps run on.
struct LogitsBench {
  JobConfig config;
  JobContext ctx;
  CollatedBatch batch;
  int batch_size = 0;
  int response_len = 0;
  double temperature = 0;
  int64_t seq_len = 0;
};

absl::StatusOr<LogitsBench> PrepareLogitsBench(const BenchLogitsArgs& args) {
  LogitsBench b;
  FUSIONRL_ASSIGN_OR_RETURN(b.config,
                            LoadBenchConfig(args.config_path, args.overrides));
  b.batch_size = b.config.optim.micro_batch_size;
  b.response_len = b.config.rollout.max_new_tokens;
  b.temperature = b.config.rollout.temperature;
  FUSIONRL_ASSIGN_OR_RETURN(b.ctx, PrepareJob(b.config, std::string()));
  b.ctx.policy->set_training(true);
  FUSIONRL_ASSIGN_OR_RETURN(b.batch,
                            RlShapedBatch(b.ctx, b.batch_size, b.response_len));
  b.seq_len = b.batch.input_ids.size(1);
  if (b.seq_len > b.config.model.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        args.config_path, ": model.max_seq_len: ", b.config.model.max_seq_len,
        " is shorter than the prompt (", b.batch.prompt_len,
        " tokens) + rollout.max_new_tokens (", b.response_len, ")"));
  }
  return b;
}

// A warm-up step per setting (gradients and log-probs kept for the
// differences; it also creates the gradient buffers, so every timed step
// allocates the same), then the timed repeats interleaved across the
// settings so each ratio compares steps taken side by side.
absl::StatusOr<std::vector<ChunkRun>> RunChunks(
    const std::vector<int64_t>& chunks, int repeats, LogitsBench& b) {
  PolicyModel& policy = *b.ctx.policy;
  std::vector<ChunkRun> runs(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    runs[i].chunk = chunks[i];
    spdlog::info("bench-logits: warm-up, chunk {}", runs[i].chunk);
    FUSIONRL_ASSIGN_OR_RETURN(
        StepResult s, Step(policy, b.batch, b.temperature, runs[i].chunk));
    runs[i].logp = s.logp;
    for (const at::Tensor& p : policy.parameters()) {
      runs[i].grads.push_back(p.grad().defined() ? p.grad().clone()
                                                 : at::zeros_like(p));
    }
  }
  for (int r = 0; r < repeats; ++r) {
    for (ChunkRun& run : runs) {
      FUSIONRL_ASSIGN_OR_RETURN(
          StepResult s, Step(policy, b.batch, b.temperature, run.chunk));
      s.logp = at::Tensor();
      spdlog::info(
          "bench-logits: repeat {} chunk {}: peak {:.1f} MiB, {:.3f} s", r,
          run.chunk, s.peak_bytes / 1048576.0,
          s.forward_seconds + s.backward_seconds);
      run.steps.push_back(std::move(s));
    }
  }
  return runs;
}

double MedianStepSeconds(const ChunkRun& run) {
  std::vector<double> t;
  for (const StepResult& s : run.steps) {
    t.push_back(s.forward_seconds + s.backward_seconds);
  }
  return Median(t);
}

// One setting's figures, next to the materialised head's (`ref`).
nlohmann::ordered_json SettingJson(const ChunkRun& run, const ChunkRun& ref) {
  const double t_ref = MedianStepSeconds(ref);
  const int64_t peak_ref = ref.steps.front().peak_bytes;
  std::vector<double> step_s, fwd_s, bwd_s;
  std::vector<int64_t> peaks, helds;
  for (const StepResult& s : run.steps) {
    step_s.push_back(s.forward_seconds + s.backward_seconds);
    fwd_s.push_back(s.forward_seconds);
    bwd_s.push_back(s.backward_seconds);
    peaks.push_back(s.peak_bytes);
    helds.push_back(s.held_bytes);
  }
  const bool identical =
      std::all_of(peaks.begin(), peaks.end(),
                  [&](int64_t p) { return p == peaks.front(); }) &&
      std::all_of(helds.begin(), helds.end(),
                  [&](int64_t h) { return h == helds.front(); });
  if (!identical) {
    spdlog::warn(
        "bench-logits: chunk {}: peak or held bytes differ across "
        "repeats",
        run.chunk);
  }
  const double t = Median(step_s);
  nlohmann::ordered_json s = {
      {"chunk_tokens", run.chunk},
      {"peak_bytes", peaks.front()},
      {"held_bytes", helds.front()},
      {"bytes_identical_across_repeats", identical},
      {"median_step_seconds", t},
      {"median_forward_seconds", Median(fwd_s)},
      {"median_backward_seconds", Median(bwd_s)},
      {"step_seconds", step_s},
      {"peak_ratio_to_chunk0",
       peak_ref > 0 ? static_cast<double>(peaks.front()) / peak_ref : 0.0},
      {"time_ratio_to_chunk0", t_ref > 0 ? t / t_ref : 0.0},
      {"max_abs_logp_diff_vs_chunk0",
       (run.logp - ref.logp).abs().max().item<double>()},
      {"max_rel_grad_diff_vs_chunk0",
       MaxRelativeGradDiff(run.grads, ref.grads)}};
  if (!identical) {
    s["peak_bytes_per_repeat"] = peaks;
    s["held_bytes_per_repeat"] = helds;
  }
  return s;
}

// The shape of the benchmark: config, model and micro-batch.
nlohmann::ordered_json LogitsBenchHeader(const BenchLogitsArgs& args,
                                         const LogitsBench& b) {
  const int64_t n_tokens = b.batch.response_mask.sum().item<int64_t>();
  const int64_t vocab = b.ctx.policy->vocab_size();
  nlohmann::ordered_json result;
  result["config"] = args.config_path;
  result["device"] = b.config.device;
  result["num_threads"] = b.config.num_threads;
  result["vocab_size"] = vocab;
  result["num_parameters"] = b.ctx.policy->num_parameters();
  result["batch"] = {{"sequences", b.batch_size},
                     {"prompt_tokens", b.batch.prompt_len},
                     {"response_tokens", b.response_len},
                     {"sequence_tokens", b.seq_len},
                     {"response_positions", n_tokens}};
  // What the materialised head's float logits take: over the response
  // positions, and over every position (what Forward() returns).
  result["logits_bytes_response"] = n_tokens * vocab * 4;
  result["logits_bytes_all_positions"] = b.batch_size * b.seq_len * vocab * 4;
  result["repeats"] = args.repeats;
  result["entropy_coef"] = kEntropyCoef;
  return result;
}

}  // namespace

int RunBenchLogits(const BenchLogitsArgs& args) {
  absl::StatusOr<std::vector<int64_t>> chunks = ParseChunks(args.chunks);
  if (!chunks.ok()) return Fail(chunks.status());
  absl::StatusOr<LogitsBench> bench = PrepareLogitsBench(args);
  if (!bench.ok()) return Fail(bench.status());
  absl::StatusOr<std::vector<ChunkRun>> runs =
      RunChunks(*chunks, args.repeats, *bench);
  if (!runs.ok()) return Fail(runs.status());
  nlohmann::ordered_json result = LogitsBenchHeader(args, *bench);
  nlohmann::ordered_json settings = nlohmann::ordered_json::object();
  for (const ChunkRun& run : *runs) {
    settings[std::to_string(run.chunk)] = SettingJson(run, runs->front());
  }
  result["settings"] = settings;
  return WriteBenchResult(result, args.out);
}

}  // namespace fusionrl::cli
