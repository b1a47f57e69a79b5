// A section of the job configuration: what is sampled and how (task.*,
// rollout.*, env.*).
// Include fusionrl/config.h, which holds every section and the functions
// that load and validate a job.
#ifndef FUSIONRL_CONFIG_ROLLOUT_H_
#define FUSIONRL_CONFIG_ROLLOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusionrl {

// A task with a verifiable reward. Which fields matter depends on `name`.
struct TaskConfig {
  // addition | countdown | repeat | reverse | sort | jsonl | math
  std::string name = "addition";
  int64_t seed = 1234;   // seeds the train generator and the eval split
  int eval_size = 200;   // held-out prompts; never used for training
  int min_digits = 1;    // addition: operand digits; reverse/sort: length
  int max_digits = 3;    //   of the string; repeat: the count of a short
                         //   problem (min_digits..max_digits)
  int num_operands = 3;  // countdown: how many numbers are given
  int max_operand = 20;  // countdown: numbers are drawn from 1..max
  // repeat: share of long problems, whose count is drawn from
  // (long_max + 1) / 2..long_max; answers are at most 2 * long_max chars.
  double long_fraction = 0.125;
  int long_max = 24;
  std::string train_path;  // jsonl, math: training file (one JSON object a
                           //   line)
  std::string eval_path;   // jsonl, math: held-out file; "" = hold out the
                           //   last eval_size lines of train_path
  // RewardFn name (see fusionrl/task.h); "" = the task's default verifier.
  std::string reward;
  // How a problem becomes prompt text: chatml | llama3 | none, or "" = auto:
  // detected from the chat_template of a Hugging Face model's
  // tokenizer_config.json (an error if it is not recognised), none for the
  // built-in character model.
  std::string chat_template;
  // System message put before every prompt; "" = none. A problem's own
  // system message takes its place.
  std::string system_prompt;
};

// Autoregressive sampling.
// rollout.decode (see RolloutConfig).
enum class DecodeMode { kFused, kComposite, kStatic };
absl::StatusOr<DecodeMode> ParseDecodeMode(absl::string_view name);
const char* DecodeModeName(DecodeMode mode);

// What happens to a response cut at rollout.max_new_tokens
// (rollout.overlong): keep | mask | penalize (see RolloutConfig).
enum class OverlongMode { kKeep, kMask, kPenalize };
absl::StatusOr<OverlongMode> ParseOverlongMode(absl::string_view name);
const char* OverlongModeName(OverlongMode mode);

struct RolloutConfig {
  int prompts_per_step = 16;  // prompt groups sampled per RL step
  int group_size = 8;         // responses per prompt (GRPO/RLOO group)
  int max_new_tokens = 16;    // response length cap (tokens, eos included)
  double temperature = 1.0;   // 0 = greedy
  int top_k = 0;              // 0 = off
  double top_p = 1.0;         // 1 = off
  // Decode path (engine/rollout/rollout.h): fused = the CPU decoder with fused
  // kernels, prefix sharing and continuous batching where it supports the
  // policy (a float32 dense model on a CPU), else composite; composite = the
  // module graph with prefix sharing and row compaction (what MoE policies
  // and CUDA devices run); static = the reference loop (every row prefilled
  // and decoded to the end).
  DecodeMode decode = DecodeMode::kFused;
  // Fused path: sequences decoded at once; a finished one's slot takes the
  // next waiting one (continuous batching). 0 = all of a step's sequences.
  // Bounds the KV cache at decode_slots x (prompt + max_new_tokens).
  int decode_slots = 0;
  // Fused and disaggregated placements, fused decode path: the rollout
  // thread samples the steps StaleSync admits at once that share a policy
  // version in one engine call, a finished sequence's slot taking the next
  // waiting one of the same or a later step (worker/fused_rollout.h).
  bool cross_step_batching = true;
  // Responses cut at max_new_tokens without a stop token (docs/tasks.md
  // "Overlong responses"): keep = graded and trained as written; mask =
  // graded (their group's advantages use the reward) but their tokens leave
  // the loss (DAPO's overlong filter); penalize = DAPO's soft overlong
  // punishment: a response longer than max_new_tokens - overlong_buffer
  // loses overlong_penalty x (length - (max_new_tokens - overlong_buffer)) /
  // overlong_buffer of reward, up to overlong_penalty at the cap.
  OverlongMode overlong = OverlongMode::kKeep;
  int overlong_buffer = 0;        // penalize: tokens of the ramp; 0 = auto
  double overlong_penalty = 1.0;  // penalize: reward lost at the cap
};

// Every string-valued mode of the config below is an enum, parsed once by
// the config reader from its YAML spelling (ParseX) and written back by the
// emitter with the same spelling (XName); code compares enumerators, never
// strings. ParseX gives InvalidArgument "must be one of <the spellings, in
// this order>; got '<name>'" for anything else; XName gives "?" for a value
// out of the enum's range (which ValidateJobConfig() refuses).

// Multi-turn rollouts (include/fusionrl/environment.h, docs/agents.md): an
// environment answers each assistant turn; a sample is a whole episode.
struct EnvConfig {
  // "" = single-turn rollouts (the default); a registered environment
  // ("calculator", "no_tools", your own) or "remote" (gRPC servers).
  std::string name;
  // remote: "host:port", or several comma-separated (episodes are spread
  // over them by their index).
  std::string address;
  // How tool calls are written and parsed: auto = from the chat template
  // (hermes for <tool_call>, llama3 for Llama-3 templates, plain without a
  // template); hermes | llama3 | plain ("[name text]").
  std::string tool_format = "auto";
  int max_turns = 4;  // assistant turns per episode
  // Model + environment tokens after the prompt; 0 = whatever the model's
  // max_seq_len leaves after the prompt. rollout.max_new_tokens bounds
  // each turn.
  int max_episode_tokens = 0;
  double call_deadline_seconds = 10;  // each Open / Step call
  double episode_env_seconds = 60;    // all environment calls of an episode
  int max_concurrency = 16;           // environment calls in flight at once
  // An episode whose environment failed (an error, a deadline): zero =
  // trained with reward 0; drop = its group kept out of the loss.
  std::string on_failure = "zero";
  // An unreachable environment (UNAVAILABLE: connection refused, a server
  // down or restarting) fails no episode: the step runs those episodes
  // again with backoff for up to this long from the end of the attempt
  // that first met it, then fails the job naming the server. 0 = fail at
  // once.
  double unavailable_seconds = 120;
  // A turn's answer joins the decode batch this many decode steps after
  // the turn ended (the rollout waits for it then, never earlier): the
  // schedule, so the samples, do not depend on how fast the environment
  // answered. Larger values hide slower environments.
  int admit_after_steps = 1;
};

}  // namespace fusionrl

#endif  // FUSIONRL_CONFIG_ROLLOUT_H_
