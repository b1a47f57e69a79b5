#include "engine/job_common.h"

#include <ATen/Parallel.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string_view>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "core/hf_config.h"
#include "core/metrics.h"
#include "core/status_macros.h"
#include "engine/agent_loop.h"
#include "engine/checkpoint.h"
#include "engine/hf_model.h"
#include "engine/intra_op_threads.h"
#include "engine/rollout.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "tasks/rewards.h"

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

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadJobTokenizer(
    const ModelConfig& model) {
  const std::string& dir =
      !model.tokenizer.empty() ? model.tokenizer : model.hf_path;
  if (dir.empty()) return MakeCharTokenizer();
  auto tokenizer = LoadTokenizer(dir);
  if (!tokenizer.ok()) {
    return absl::Status(
        tokenizer.status().code(),
        absl::StrCat(
            model.tokenizer.empty() ? "model.hf_path: " : "model.tokenizer: ",
            tokenizer.status().message()));
  }
  return tokenizer;
}

absl::StatusOr<ChatRenderer> ResolveChatRenderer(const JobConfig& config) {
  const ModelConfig& m = config.model;
  return ChatRenderer::ForJob(config.task.chat_template,
                              !m.tokenizer.empty() ? m.tokenizer : m.hf_path);
}

absl::StatusOr<JobContext> PrepareJob(const JobConfig& config,
                                      const std::string& output_dir,
                                      const std::string& device) {
  SetIntraOpThreads(config.num_threads);
  JobContext ctx;
  FUSIONRL_ASSIGN_OR_RETURN(
      ctx.device, ResolveDevice(device.empty() ? config.device : device));
  FUSIONRL_ASSIGN_OR_RETURN(ctx.tokenizer, LoadJobTokenizer(config.model));
  FUSIONRL_ASSIGN_OR_RETURN(ctx.chat, ResolveChatRenderer(config));
  ctx.system_prompt = config.task.system_prompt;
  FUSIONRL_ASSIGN_OR_RETURN(ctx.task,
                            TaskRegistry::Global().Create(config.task));
  const std::string reward_name = config.task.reward.empty()
                                      ? ctx.task->default_reward()
                                      : config.task.reward;
  FUSIONRL_ASSIGN_OR_RETURN(ctx.reward,
                            RewardRegistry::Global().Create(reward_name));

  // Stop ids: the tokenizer's eos, the model's generation eos list, the
  // chat format's end of turn.
  auto add_stop = [&](int id) {
    if (id >= 0 && std::find(ctx.stop_ids.begin(), ctx.stop_ids.end(), id) ==
                       ctx.stop_ids.end()) {
      ctx.stop_ids.push_back(id);
    }
  };
  add_stop(ctx.tokenizer->eos_id());
  if (!config.model.hf_path.empty()) {
    FUSIONRL_ASSIGN_OR_RETURN(HfModelInfo info,
                              ReadHfModelConfig(config.model.hf_path));
    for (int id : info.eos_token_ids) add_stop(id);
  }
  if (!ctx.chat.end_of_turn().empty()) {
    add_stop(ctx.tokenizer->TokenToId(ctx.chat.end_of_turn()));
  }

  ctx.env = config.env;
  if (!config.env.name.empty()) {
    // The registry's and the factories' errors name their key (env.name,
    // env.address).
    FUSIONRL_ASSIGN_OR_RETURN(ctx.environment,
                              EnvironmentRegistry::Global().Create(config.env));
    FUSIONRL_ASSIGN_OR_RETURN(
        ctx.tool_format, ResolveToolFormat(config.env.tool_format, ctx.chat));
  }

  const int vocab = config.model.vocab_size > 0 ? config.model.vocab_size
                                                : ctx.tokenizer->vocab_size();
  if (vocab < ctx.tokenizer->vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.vocab_size: ", vocab, " is smaller than the tokenizer's ",
        ctx.tokenizer->vocab_size(), " ids"));
  }
  FUSIONRL_ASSIGN_OR_RETURN(
      ctx.policy, PolicyModel::Create(config.model, vocab, ctx.device,
                                      static_cast<uint64_t>(config.seed)));
  // A LoRA job's base is hf_path's weights even with an init_checkpoint
  // that holds adapters only (a full one replaces them below).
  if (!config.model.hf_path.empty() &&
      (config.init_checkpoint.empty() || ctx.policy->lora())) {
    if (auto status = LoadHfWeights(config.model.hf_path, *ctx.policy);
        !status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("model.hf_path: ", status.message()));
    }
  }
  if (!config.init_checkpoint.empty()) {
    auto meta = ReadCheckpoint(config.init_checkpoint, *ctx.policy, nullptr);
    if (!meta.ok()) {
      return absl::Status(
          meta.status().code(),
          absl::StrCat("init_checkpoint: ", meta.status().message()));
    }
  }
  if (!config.model.lora_path.empty()) {
    if (auto status = LoadPeftAdapter(config.model.lora_path, *ctx.policy);
        !status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("model.lora_path: ", status.message()));
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

absl::Status ExportJobPolicy(const JobConfig& config, const JobContext& ctx,
                             const PolicyModel& policy,
                             const std::string& out_dir) {
  HfExportOptions options;
  options.dtype = config.run.export_dtype;
  options.tokenizer_dir = !config.model.tokenizer.empty()
                              ? config.model.tokenizer
                              : config.model.hf_path;
  options.source_dir = config.model.hf_path;
  options.bos_token_id = ctx.tokenizer->bos_id();
  if (!config.model.hf_path.empty()) {
    FUSIONRL_ASSIGN_OR_RETURN(HfModelInfo info,
                              ReadHfModelConfig(config.model.hf_path));
    if (info.bos_token_id >= 0) options.bos_token_id = info.bos_token_id;
    options.max_position_embeddings = info.max_position_embeddings;
  }
  options.eos_token_ids = ctx.stop_ids;
  // LoRA: the adapter as PEFT writes it (<out_dir>-lora), and the merged
  // model, which loads as it is, at out_dir.
  std::unique_ptr<PolicyModel> merged;
  if (policy.lora()) {
    const std::string lora_dir = out_dir + "-lora";
    if (auto status =
            ExportPeftAdapter(policy, lora_dir, LoraBaseModel(config));
        !status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("run.export_final: ", status.message()));
    }
    spdlog::info("[{}] exported the LoRA adapter (PEFT): {}", config.name,
                 lora_dir);
    merged = policy.CloneFrozen();
  }
  auto status = ExportHfModel(merged ? *merged : policy, out_dir, options);
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("run.export_final: ", status.message()));
  }
  spdlog::info("[{}] exported the policy as a Hugging Face model{}: {}",
               config.name, merged ? " (LoRA merged)" : "", out_dir);
  return absl::OkStatus();
}

std::string LoraBaseModel(const JobConfig& config) {
  if (!config.init_checkpoint.empty()) return config.init_checkpoint;
  return config.model.hf_path;
}

namespace {

bool IsStopId(const JobContext& ctx, int id) {
  return std::find(ctx.stop_ids.begin(), ctx.stop_ids.end(), id) !=
         ctx.stop_ids.end();
}

// A rendering error of `problem`'s conversation, naming the problem.
absl::Status ProblemError(const Problem& problem, const absl::Status& status) {
  std::string prompt = problem.prompt.substr(0, 60);
  if (prompt.size() < problem.prompt.size()) prompt += "...";
  return absl::Status(status.code(),
                      absl::StrCat("the conversation of problem '", prompt,
                                   "': ", status.message()));
}

}  // namespace

absl::StatusOr<std::vector<int>> EncodePrompt(const Tokenizer& tokenizer,
                                              const std::string& prompt) {
  FUSIONRL_ASSIGN_OR_RETURN(std::vector<int> ids, tokenizer.Encode(prompt));
  if (tokenizer.bos_id() >= 0) ids.insert(ids.begin(), tokenizer.bos_id());
  return ids;
}

absl::StatusOr<std::vector<int>> EncodeProblemPrompt(const JobContext& ctx,
                                                     const Problem& problem) {
  absl::StatusOr<std::vector<int>> ids =
      EncodeConversation(ctx, ProblemMessages(problem, ctx.system_prompt));
  if (!ids.ok()) return ProblemError(problem, ids.status());
  return ids;
}

absl::StatusOr<std::vector<int>> EncodeConversation(
    const JobContext& ctx, const std::vector<ChatMessage>& messages,
    const std::string& tools_json) {
  FUSIONRL_ASSIGN_OR_RETURN(
      std::string text,
      ctx.chat.Render(messages, /*add_generation_prompt=*/true, tools_json));
  if (!ctx.chat.writes_bos()) return EncodePrompt(*ctx.tokenizer, text);
  // The chat format writes any begin-of-text token itself.
  return ctx.tokenizer->Encode(text);
}

absl::StatusOr<Sample> SolutionSample(const JobContext& ctx,
                                      const Problem& problem) {
  Sample s;
  FUSIONRL_ASSIGN_OR_RETURN(s.prompt_ids, EncodeProblemPrompt(ctx, problem));
  // The assistant's turn as the chat format writes it (a template may add
  // more than the answer, e.g. Qwen3's empty thinking block), up to and
  // including its first stop token; without one, eos ends it.
  absl::StatusOr<std::string> turn = ctx.chat.AssistantTurn(
      ProblemMessages(problem, ctx.system_prompt), ctx.task->Solution(problem));
  if (!turn.ok()) return ProblemError(problem, turn.status());
  FUSIONRL_ASSIGN_OR_RETURN(s.response_ids, TurnTokens(ctx, *turn));
  return s;
}

absl::StatusOr<std::vector<int>> TurnTokens(const JobContext& ctx,
                                            const std::string& turn) {
  FUSIONRL_ASSIGN_OR_RETURN(std::vector<int> ids, ctx.tokenizer->Encode(turn));
  std::vector<int> out;
  for (int id : ids) {
    out.push_back(id);
    if (IsStopId(ctx, id)) return out;
  }
  out.push_back(ctx.tokenizer->eos_id());
  return out;
}

bool OpensThinking(const JobContext& ctx, const std::vector<int>& ids) {
  // The generation prompt's end: a few tokens hold a "<think>\n" opener.
  constexpr size_t kTail = 8;
  const size_t from = ids.size() > kTail ? ids.size() - kTail : 0;
  const std::vector<int> tail(ids.begin() + static_cast<std::ptrdiff_t>(from),
                              ids.end());
  return tasks::EndsInsideThinking(ctx.tokenizer->Decode(tail));
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

std::string DecodeResponse(const JobContext& ctx,
                           const std::vector<int>& tokens) {
  std::vector<int> body;
  for (int t : tokens) {
    if (std::find(ctx.stop_ids.begin(), ctx.stop_ids.end(), t) !=
        ctx.stop_ids.end()) {
      break;
    }
    body.push_back(t);
  }
  return ctx.tokenizer->Decode(body);
}

Verdict ScoreCompletion(const JobContext& ctx, const Problem& problem,
                        const std::vector<int>& prompt_ids,
                        const std::vector<int>& response_ids) {
  const bool prompt_opens_thinking = OpensThinking(ctx, prompt_ids);
  const std::string response = DecodeResponse(ctx, response_ids);
  const std::optional<std::string_view> answer =
      tasks::AnswerText(response, prompt_opens_thinking);
  if (!answer.has_value()) return Verdict{0.0, false};
  return ctx.reward->Score(problem, *answer);
}

absl::StatusOr<EvalResult> EvaluateGreedy(PolicyModel& model,
                                          const JobContext& ctx,
                                          int max_new_tokens, bool joins_only) {
  const auto start = std::chrono::steady_clock::now();
  const auto& problems = ctx.task->eval_set();
  GradientSync* lockstep =
      model.expert_shard().size > 1 ? model.expert_group() : nullptr;
  if (joins_only && lockstep == nullptr) {
    return absl::FailedPreconditionError(
        "EvaluateGreedy: only a rank of an expert group joins another's "
        "evaluation");
  }
  RolloutEngine engine(model, ctx.tokenizer->pad_id(), ctx.stop_ids);
  engine.set_expert_lockstep(lockstep);
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = max_new_tokens;
  constexpr size_t kBatch = 256;
  EvalResult result;
  double reward_sum = 0;
  int64_t correct = 0;
  for (size_t i = 0; i < problems.size(); i += kBatch) {
    // A joining rank runs every batch's call with nothing of its own.
    const size_t end = joins_only ? i : std::min(problems.size(), i + kBatch);
    if (ctx.environment != nullptr) {
      // Multi-turn: greedy episodes against the job's environment.
      const std::vector<Problem> slice(problems.begin() + i,
                                       problems.begin() + end);
      std::vector<SequenceKey> keys;
      for (size_t j = i; j < end; ++j) {
        keys.push_back(SequenceKey{0, static_cast<int64_t>(j), 0, 0});
      }
      FUSIONRL_ASSIGN_OR_RETURN(
          EpisodeBatch episodes,
          AgentLoop(ctx).Run(model, slice, keys, greedy, /*slots=*/0,
                             /*row_blocks=*/0, /*fused=*/true, lockstep));
      for (const Sample& s : episodes.samples) {
        reward_sum += s.reward;
        correct += s.correct ? 1 : 0;
      }
      continue;
    }
    std::vector<std::vector<int>> prompts;
    for (size_t j = i; j < end; ++j) {
      FUSIONRL_ASSIGN_OR_RETURN(auto ids,
                                EncodeProblemPrompt(ctx, problems[j]));
      prompts.push_back(std::move(ids));
    }
    FUSIONRL_ASSIGN_OR_RETURN(auto completions,
                              engine.Generate(prompts, greedy, /*seed=*/0));
    for (size_t j = i; j < end; ++j) {
      const Verdict v = ScoreCompletion(ctx, problems[j], prompts[j - i],
                                        completions[j - i].tokens);
      reward_sum += v.reward;
      correct += v.correct ? 1 : 0;
    }
  }
  if (joins_only) {
    result.seconds = SecondsSince(start);
    return result;
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
