// What the RL, SFT and eval jobs share: turning a validated JobConfig into a
// ready policy, task and reward, and greedy evaluation on the held-out split.
#ifndef FUSIONRL_ENGINE_JOB_COMMON_H_
#define FUSIONRL_ENGINE_JOB_COMMON_H_

#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/job_summary.h"
#include "engine/model.h"
#include "engine/sample.h"
#include "fusionrl/config.h"
#include "fusionrl/environment.h"
#include "fusionrl/job.h"
#include "fusionrl/task.h"
#include "fusionrl/tokenizer.h"
#include "tasks/chat_format.h"
#include "tasks/tool_calls.h"

namespace fusionrl {

// "cpu", "cuda", "cuda:1" -> a device this LibTorch build can use;
// FailedPrecondition (naming the `device` key) when CUDA is asked for but
// unavailable.
absl::StatusOr<c10::Device> ResolveDevice(const std::string& name);

struct JobContext {
  c10::Device device = c10::Device("cpu");
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Task> task;
  std::unique_ptr<RewardFn> reward;
  // The Hugging Face weights of model.hf_path, or a seeded random init;
  // then init_checkpoint's weights if set.
  std::unique_ptr<PolicyModel> policy;
  // Generation stops at any of these: the tokenizer's eos, the model's
  // generation_config.json eos ids and the chat format's end-of-turn token.
  std::vector<int> stop_ids;
  // How a problem becomes the prompt text (task.chat_template, or the
  // model's own chat template).
  ChatRenderer chat;
  std::string system_prompt;  // task.system_prompt
  // Multi-turn rollouts (env.name set; null otherwise): the environment and
  // how the policy writes tool calls (env.tool_format resolved).
  std::shared_ptr<Environment> environment;
  ToolFormat tool_format = ToolFormat::kPlain;
  EnvConfig env;  // the job's env section
};

// The job's tokenizer: model.tokenizer's directory, else model.hf_path's,
// else the character tokenizer.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadJobTokenizer(
    const ModelConfig& model);

// The chat renderer of a job: task.chat_template when set; else, for a
// model with a tokenizer directory, the model's own chat template
// (NotFound / InvalidArgument naming the file when it has none or it does
// not parse); else none (tasks/chat_format.h).
absl::StatusOr<ChatRenderer> ResolveChatRenderer(const JobConfig& config);

// Sets LibTorch's thread count, resolves the device (`device`, or
// config.device when empty), builds tokenizer, task, reward and policy
// (imports model.hf_path's weights), loads config.init_checkpoint. When
// `output_dir` is non-empty, creates it and writes the resolved config there
// as config.yaml.
absl::StatusOr<JobContext> PrepareJob(const JobConfig& config,
                                      const std::string& output_dir,
                                      const std::string& device = "");

// Writes `policy` as a Hugging Face directory at `out_dir` (ExportHfModel)
// with the job's tokenizer files, bos and stop ids, in
// config.run.export_dtype. A LoRA policy is written merged, and its adapter
// as a PEFT directory at "<out_dir>-lora".
absl::Status ExportJobPolicy(const JobConfig& config, const JobContext& ctx,
                             const PolicyModel& policy,
                             const std::string& out_dir);

// The base model a LoRA job's adapters apply to (adapter_config.json's
// base_model_name_or_path): init_checkpoint, else model.hf_path.
std::string LoraBaseModel(const JobConfig& config);

// bos + the prompt's tokens.
absl::StatusOr<std::vector<int>> EncodePrompt(const Tokenizer& tokenizer,
                                              const std::string& prompt);

// The token ids `problem` is given to the policy as: its conversation
// (system prompt, messages) rendered in the job's chat format with the
// generation prompt, then encoded; bos first when the tokenizer has one and
// the format does not write it (format none). For the built-in tasks
// (format none, no system prompt) this is EncodePrompt(prompt).
// InvalidArgument when the template rejects the conversation, naming the
// problem.
absl::StatusOr<std::vector<int>> EncodeProblemPrompt(const JobContext& ctx,
                                                     const Problem& problem);

// `messages` rendered in the job's chat format with the generation prompt
// (and the template's `tools`, a JSON array, when `tools_json` is set),
// then encoded, bos first as in EncodeProblemPrompt. Errors as
// ChatRenderer::Render.
absl::StatusOr<std::vector<int>> EncodeConversation(
    const JobContext& ctx, const std::vector<ChatMessage>& messages,
    const std::string& tools_json = "");

// A supervised sample of `problem`: its prompt (EncodeProblemPrompt), and
// the task's reference solution + eos as the response.
absl::StatusOr<Sample> SolutionSample(const JobContext& ctx,
                                      const Problem& problem);

// The tokens of an assistant turn as a chat format writes it (`turn`, e.g.
// ChatRenderer::AssistantTurn): encoded up to and including its first stop
// id; without one, eos ends it.
absl::StatusOr<std::vector<int>> TurnTokens(const JobContext& ctx,
                                            const std::string& turn);

// Whether `ids` (a prompt, or an environment's answer, ending in the
// generation prompt) leave a thinking block open (Qwen3-Thinking and QwQ
// end theirs with "<think>\n"): decoded from their last few tokens.
bool OpensThinking(const JobContext& ctx, const std::vector<int>& ids);

// Response tokens -> text, stopping at eos.
std::string DecodeResponse(const Tokenizer& tokenizer,
                           const std::vector<int>& tokens);
// Response tokens -> text, stopping at any of the job's stop ids.
std::string DecodeResponse(const JobContext& ctx,
                           const std::vector<int>& tokens);

// The task's verdict on a completion of `prompt_ids`: the response decoded
// up to the job's stop ids and graded on its answer text (tasks/rewards.h
// AnswerText: after the last "</think>"). A response that ends inside a
// thinking block, its own or one the prompt's generation prompt opened, has
// no answer: {0, wrong}.
Verdict ScoreCompletion(const JobContext& ctx, const Problem& problem,
                        const std::vector<int>& prompt_ids,
                        const std::vector<int>& response_ids);

struct EvalResult {
  double accuracy = 0;  // fraction of eval problems answered correctly
  double reward_mean = 0;
  int64_t problems = 0;
  double seconds = 0;
};

// Greedy decoding of every eval problem with `model`, in batches.
//
// An expert shard (placement.expert_sampling: shard) decodes in lockstep
// with its group (RolloutEngine::set_expert_lockstep): every rank of the
// group calls this at once, one of them to evaluate and the others with
// `joins_only`, who join its forwards with no prompts and return an empty
// result (problems 0). The evaluating rank decodes the batches a whole
// model would, so its result is the whole model's.
absl::StatusOr<EvalResult> EvaluateGreedy(PolicyModel& model,
                                          const JobContext& ctx,
                                          int max_new_tokens,
                                          bool joins_only = false);

// Seconds elapsed since `start` on the steady clock.
inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_JOB_COMMON_H_
