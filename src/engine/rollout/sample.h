// One rollout sample: a prompt, one sampled response and everything the
// trainer needs to learn from it, including what off-policy correction needs
// (the behaviour log-probs and the policy version that produced them).
//
// Plain host data (no tensors), so samples can be queued, moved between
// threads and sent over the wire cheaply; the trainer collates them.
#ifndef FUSIONRL_ENGINE_ROLLOUT_SAMPLE_H_
#define FUSIONRL_ENGINE_ROLLOUT_SAMPLE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fusionrl {

// A multi-turn episode's record (env.name set; all zero otherwise).
struct EpisodeStats {
  int32_t turns = 0;        // assistant turns
  int32_t tool_calls = 0;   // calls parsed and sent to the environment
  int32_t tool_errors = 0;  // malformed calls and calls to unknown tools
  double env_seconds = 0;   // time in environment calls
  bool env_failed = false;  // the environment failed the episode
  // The environment's own metrics (Observation::metrics), summed over the
  // episode's steps.
  std::map<std::string, double> metrics;
};

struct Sample {
  uint64_t group_id = 0;              // samples of one prompt share a group id
  uint64_t problem_index = 0;         // Task::TrainProblem index of the prompt
  std::vector<int> prompt_ids;        // bos + prompt tokens
  std::vector<int> response_ids;      // sampled tokens, eos included if hit
  std::vector<float> behaviour_logp;  // log-prob of each response token
  // Multi-turn episodes: per response token, 1 for a token the policy
  // sampled, 0 for one the environment's answer added (never trained, its
  // behaviour_logp is 0). Empty: every response token is the policy's.
  std::vector<uint8_t> loss_mask;
  EpisodeStats episode;
  // The policy version that sampled it; with a partial rollout (a response
  // continued under newer weights), the oldest of its tokens' versions:
  // staleness is counted from it.
  int64_t behaviour_version = 0;
  // Partial rollout: the version that sampled each response token, where
  // the response spans more than one (empty: all are behaviour_version).
  std::vector<int64_t> token_versions;
  // MoE policies: the experts the rollout routed each token to,
  // [position][layer][choice] (n_layers * top_k values per token) over the
  // prompt's tokens then the response's, the first N positions (N =
  // routes.size() / (n_layers * top_k); the last response token is never
  // fed, so N = prompt + response - 1). A token continued or re-fed in a
  // later call keeps its first record. Empty: none (a dense policy). The
  // trainer replays them (algorithm.router_replay)
  // and measures its disagreement with them.
  std::vector<int8_t> routes;
  bool finished = false;  // ended with eos (false: cut at max_new_tokens)
  double reward = 0.0;    // from the task's RewardFn
  bool correct = false;   // counted in accuracy
  // Dropped from training (StaleSync over-stale drop): kept for the batch's
  // shape, masked out of every loss term, normaliser and statistic.
  bool excluded = false;
};

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_ROLLOUT_SAMPLE_H_
