// FusionRL job configuration.
//
// A job is fully described by one YAML file. Configuration flows one way:
//   YAML text -> LoadJobConfig() -> JobConfig (plain structs, validated once)
//   -> passed by const reference to every component.
// Every field has its default inline and a comment. Tests build configs in
// code by starting from `JobConfig{}` and changing fields.
//
// Errors: LoadJobConfig() never throws. A bad file yields an
// InvalidArgument (bad key, type or value) or NotFound (missing file) status
// whose message is one line: "<file>: <key.path>: <reason>".
#ifndef FUSIONRL_CONFIG_H_
#define FUSIONRL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fusionrl {

// Decoder-only transformer (Llama style: RMSNorm, rotary, SwiGLU).
struct ModelConfig {
  int d_model = 128;            // hidden width; must be divisible by n_heads
  int n_layers = 4;             // transformer blocks
  int n_heads = 4;              // attention heads
  int d_ff = 384;               // SwiGLU inner width
  int max_seq_len = 64;         // longest prompt + response, in tokens
  double rope_theta = 10000.0;  // rotary base
  double norm_eps = 1e-5;       // RMSNorm epsilon
  double init_std = 0.02;       // std of the normal init of linear weights
};

// A task with a verifiable reward. Which fields matter depends on `name`.
struct TaskConfig {
  // addition | countdown | reverse | sort | jsonl
  std::string name = "addition";
  int64_t seed = 1234;     // seeds the train generator and the eval split
  int eval_size = 200;     // held-out prompts; never used for training
  int min_digits = 1;      // addition: operand digits; reverse/sort: length
  int max_digits = 3;      //   of the string (min_digits..max_digits)
  int num_operands = 3;    // countdown: how many numbers are given
  int max_operand = 20;    // countdown: numbers are drawn from 1..max
  std::string train_path;  // jsonl: training file (one JSON object a line)
  std::string eval_path;   // jsonl: held-out file; "" = hold out the
                           //   last eval_size lines of train_path
  // RewardFn name (see fusionrl/task.h); "" = the task's default verifier.
  std::string reward;
};

// Autoregressive sampling.
struct RolloutConfig {
  int prompts_per_step = 16;  // prompt groups sampled per RL step
  int group_size = 8;         // responses per prompt (GRPO/RLOO group)
  int max_new_tokens = 16;    // response length cap (tokens, eos included)
  double temperature = 1.0;   // 0 = greedy
  int top_k = 0;              // 0 = off
  double top_p = 1.0;         // 1 = off
};

// Policy-gradient algorithm: advantage estimator + clipped surrogate loss.
struct AlgorithmConfig {
  // grpo | rloo | reinforce_pp
  std::string adv_estimator = "grpo";
  bool norm_adv_by_std = true;   // grpo: false gives Dr.GRPO's r - mean(r)
  double gamma = 1.0;            // reinforce_pp: token discount
  double clip_ratio_low = 0.2;   // ratio clipped to [1 - low, 1 + high]
  double clip_ratio_high = 0.2;  // DAPO clip-higher: high > low
  double clip_ratio_c = 3.0;     // dual clip bound for negative advantages
  // token-mean | seq-mean-token-mean | seq-mean-token-sum |
  // seq-mean-token-sum-norm (Dr.GRPO)
  std::string loss_agg_mode = "token-mean";
  // KL to the frozen reference policy (the initial weights).
  double kl_coef = 0.0;             // 0 = no KL, no reference forward pass
  std::string kl_estimator = "k3";  // k1 | k2 | k3
  std::string kl_mode = "loss";     // loss (a loss term) | reward (a penalty)
  double entropy_coef = 0.0;        // entropy bonus weight
  int ppo_epochs = 1;               // passes over each rollout batch
};

// Optimizer and batching.
struct OptimConfig {
  double lr = 1e-4;           // peak learning rate
  double weight_decay = 0.0;  // AdamW decoupled weight decay
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double grad_clip = 1.0;     // max global grad norm; 0 = off
  int warmup_steps = 0;       // linear warm-up of the lr from 0
  int mini_batch_size = 0;    // sequences per optimizer step; 0 = whole batch
  int micro_batch_size = 64;  // sequences per forward/backward (accumulated)
};

// The RL loop (`fusionrl run`).
struct RunConfig {
  int total_steps = 100;     // RL steps (rollout + train)
  int eval_every = 10;       // greedy eval on the held-out split; 0 = off
  int checkpoint_every = 0;  // 0 = only the final checkpoint
  int log_every = 1;         // progress line period, in steps
  // Deadline of every collective between cards (gradient all-reduce, metric
  // sums): a card that stops answering becomes an error, not a hang.
  double collective_timeout_seconds = 300;
};

// Supervised warm start (`fusionrl sft`).
struct SftConfig {
  int steps = 300;        // optimizer steps
  int batch_size = 64;    // sequences per step
  double lr = 1e-3;       // peak learning rate (AdamW; optim.* betas,
                          //   eps, weight_decay, grad_clip apply)
  int warmup_steps = 20;  // linear warm-up of the lr from 0
  int eval_every = 100;   // greedy eval period; 0 = only at the end
};

// Which cards a job gets and what each card does. A super node is a group
// of cards with a fast local interconnect (one machine here); the job takes
// the same number of cards in each of the super nodes it spans.
struct PlacementConfig {
  // colocated-sync: every card trains and samples, alternating (hybrid
  //   engine); fused: every card trains and samples at the same time (RL
  //   Fusion); disaggregated: separate rollout and train cards.
  std::string mode = "colocated-sync";
  int super_nodes = 1;                   // super nodes the job spans
  int cards_per_super_node = 1;          // cards used in each super node
  int rollout_cards_per_super_node = 0;  // disaggregated only: how many of
                                         //   those cards sample; the rest
                                         //   train (0 for the other modes)
  bool fail_if_unplaceable = false;  // false: wait for capacity, showing the
                                     //   reason in status; true: fail the job
};

// How clients of a cluster controller (`fusionrl submit`, `fusionrl status`)
// authenticate; the controller and workers take the same as flags.
struct ClusterConfig {
  std::string auth_token_file;  // file whose first line is the shared token
  std::string auth_token_env;   // or: environment variable holding it
};

struct JobConfig {
  std::string name = "job";    // shown in logs and summaries
  std::string source_path;     // the YAML file this came from (not a key)
  int64_t seed = 1;            // seeds init, sampling and data order
  std::string device = "cpu";  // torch device string: cpu, cuda, cuda:1
  int num_threads = 2;         // LibTorch intra-op threads
  std::string output_dir = "runs/job";  // metrics, checkpoints, summary
  std::string init_checkpoint;  // policy to start from ("" = random init)
  ModelConfig model;
  TaskConfig task;
  RolloutConfig rollout;
  AlgorithmConfig algorithm;
  OptimConfig optim;
  RunConfig run;
  SftConfig sft;
  PlacementConfig placement;
  ClusterConfig cluster;
};

// Reads `path`, applies `overrides` ("key.path=value", YAML scalar syntax for
// the value) in order, and validates. Relative file paths inside the config
// (init_checkpoint, task.train_path, task.eval_path) are taken as given, i.e.
// relative to the working directory, as with any command-line tool; a path
// that does not exist is a NotFound error naming the key.
absl::StatusOr<JobConfig> LoadJobConfig(
    const std::string& path, const std::vector<std::string>& overrides = {});

// Same, from YAML text; `source_name` is used in error messages.
absl::StatusOr<JobConfig> ParseJobConfig(
    const std::string& yaml_text, const std::string& source_name,
    const std::vector<std::string>& overrides = {});

// Range and consistency checks on an already built config (LoadJobConfig
// runs them). Messages name the key path.
absl::Status ValidateJobConfig(const JobConfig& config);

// The config as YAML, with every key (for logging and for reproducing runs).
std::string JobConfigToYaml(const JobConfig& config);

}  // namespace fusionrl

#endif  // FUSIONRL_CONFIG_H_
