// A job's ready policy, task and reward (JobContext), and the text interface
// around them: problems and conversations to prompt tokens in the job's chat
// format, response tokens to text, and the task's verdict on a completion.
// Built by PrepareJob (engine/jobs/job_setup.h); read by rollout, the agent
// loop, evaluation and the SFT job.
#ifndef FUSIONRL_ENGINE_ROLLOUT_JOB_CONTEXT_H_
#define FUSIONRL_ENGINE_ROLLOUT_JOB_CONTEXT_H_

#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/rollout/sample.h"
#include "fusionrl/config.h"
#include "fusionrl/environment.h"
#include "fusionrl/task.h"
#include "fusionrl/tokenizer.h"
#include "tasks/tool_calls.h"
#include "template/chat_format.h"

namespace fusionrl {

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

// Seconds elapsed since `start` on the steady clock.
inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_ROLLOUT_JOB_CONTEXT_H_
