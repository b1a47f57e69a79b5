#include "engine/job_common.h"

#include <ATen/Parallel.h>
#include <torch/cuda.h>

#include <chrono>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "core/metrics.h"
#include "core/status_macros.h"
#include "engine/checkpoint.h"
#include "engine/rollout.h"
#include "nlohmann/json.hpp"

namespace fusionrl {

absl::StatusOr<c10::Device> ResolveDevice(const std::string& name) {
  c10::Device device("cpu");
  try {
    device = c10::Device(name);
  } catch (const c10::Error&) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: '", name, "' is not a device name"));
  }
  if (device.is_cuda()) {
    if (!torch::cuda::is_available()) {
      return absl::FailedPreconditionError(
          absl::StrCat("device: '", name,
                       "' requested, but this LibTorch build has no "
                       "CUDA or no GPU is visible"));
    }
    const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
    if (device.has_index() && device.index() >= count) {
      return absl::FailedPreconditionError(
          absl::StrCat("device: '", name, "' requested, but only ", count,
                       " GPU(s) visible"));
    }
  } else if (!device.is_cpu()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device: '", name, "' is not supported (use cpu or cuda)"));
  }
  return device;
}

absl::StatusOr<JobContext> PrepareJob(const JobConfig& config,
                                      const std::string& output_dir) {
  at::set_num_threads(config.num_threads);
  JobContext ctx;
  FUSIONRL_ASSIGN_OR_RETURN(ctx.device, ResolveDevice(config.device));
  ctx.tokenizer = MakeCharTokenizer();
  FUSIONRL_ASSIGN_OR_RETURN(ctx.task,
                            TaskRegistry::Global().Create(config.task));
  const std::string reward_name = config.task.reward.empty()
                                      ? ctx.task->default_reward()
                                      : config.task.reward;
  FUSIONRL_ASSIGN_OR_RETURN(ctx.reward,
                            RewardRegistry::Global().Create(reward_name));
  FUSIONRL_ASSIGN_OR_RETURN(
      ctx.policy,
      PolicyModel::Create(config.model, ctx.tokenizer->vocab_size(), ctx.device,
                          static_cast<uint64_t>(config.seed)));
  if (!config.init_checkpoint.empty()) {
    auto meta = ReadCheckpoint(config.init_checkpoint, *ctx.policy, nullptr);
    if (!meta.ok()) {
      return absl::Status(
          meta.status().code(),
          absl::StrCat("init_checkpoint: ", meta.status().message()));
    }
  }
  if (!output_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(output_dir, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat(
          "output_dir: cannot create '", output_dir, "': ", ec.message()));
    }
    FUSIONRL_RETURN_IF_ERROR(
        WriteFileAtomic(output_dir + "/config.yaml", JobConfigToYaml(config)));
  }
  return ctx;
}

absl::StatusOr<std::vector<int>> EncodePrompt(const Tokenizer& tokenizer,
                                              const std::string& prompt) {
  FUSIONRL_ASSIGN_OR_RETURN(std::vector<int> ids, tokenizer.Encode(prompt));
  ids.insert(ids.begin(), tokenizer.bos_id());
  return ids;
}

absl::StatusOr<Sample> SolutionSample(const JobContext& ctx,
                                      const Problem& problem) {
  Sample s;
  FUSIONRL_ASSIGN_OR_RETURN(s.prompt_ids,
                            EncodePrompt(*ctx.tokenizer, problem.prompt));
  FUSIONRL_ASSIGN_OR_RETURN(s.response_ids,
                            ctx.tokenizer->Encode(ctx.task->Solution(problem)));
  s.response_ids.push_back(ctx.tokenizer->eos_id());
  return s;
}

std::string DecodeResponse(const Tokenizer& tokenizer,
                           const std::vector<int>& tokens) {
  std::vector<int> body;
  for (int t : tokens) {
    if (t == tokenizer.eos_id()) break;
    body.push_back(t);
  }
  return tokenizer.Decode(body);
}

absl::StatusOr<EvalResult> EvaluateGreedy(PolicyModel& model,
                                          const JobContext& ctx,
                                          int max_new_tokens) {
  const auto start = std::chrono::steady_clock::now();
  const auto& problems = ctx.task->eval_set();
  RolloutEngine engine(model, ctx.tokenizer->pad_id(), ctx.tokenizer->eos_id());
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = max_new_tokens;
  constexpr size_t kBatch = 256;
  EvalResult result;
  double reward_sum = 0;
  int64_t correct = 0;
  for (size_t i = 0; i < problems.size(); i += kBatch) {
    const size_t end = std::min(problems.size(), i + kBatch);
    std::vector<std::vector<int>> prompts;
    for (size_t j = i; j < end; ++j) {
      FUSIONRL_ASSIGN_OR_RETURN(
          auto ids, EncodePrompt(*ctx.tokenizer, problems[j].prompt));
      prompts.push_back(std::move(ids));
    }
    FUSIONRL_ASSIGN_OR_RETURN(auto completions,
                              engine.Generate(prompts, greedy, /*seed=*/0));
    for (size_t j = i; j < end; ++j) {
      const Verdict v = ctx.reward->Score(
          problems[j],
          DecodeResponse(*ctx.tokenizer, completions[j - i].tokens));
      reward_sum += v.reward;
      correct += v.correct ? 1 : 0;
    }
  }
  result.problems = static_cast<int64_t>(problems.size());
  if (result.problems > 0) {
    result.accuracy = static_cast<double>(correct) / result.problems;
    result.reward_mean = reward_sum / result.problems;
  }
  result.seconds = SecondsSince(start);
  return result;
}

}  // namespace fusionrl
