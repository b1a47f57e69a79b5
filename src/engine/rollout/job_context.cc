#include "engine/rollout/job_context.h"

#include <algorithm>
#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "tasks/rewards.h"

namespace fusionrl {

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

}  // namespace fusionrl
