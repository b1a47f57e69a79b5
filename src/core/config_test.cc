#include "fusionrl/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// A file under the test temp dir with `content`; returns its path.
std::string WriteTempFile(const std::string& name, const std::string& content) {
  const std::string path =
      absl::StrCat(testing::TempDir(), "/fusionrl_config_test_", name);
  std::ofstream(path) << content;
  return path;
}

// A path under the test temp dir that does not exist.
std::string MissingPath(const std::string& name) {
  return absl::StrCat(testing::TempDir(), "/fusionrl_config_test_no_such_dir/",
                      name);
}

// Every field is emitted and doubles are exact, so equal YAML means equal
// configs.
void ExpectSameConfig(const JobConfig& a, const JobConfig& b) {
  EXPECT_EQ(JobConfigToYaml(a), JobConfigToYaml(b));
  EXPECT_EQ(a.source_path, b.source_path);
}

// Parses `yaml` as "job.yaml" and expects an error with `code` whose message
// contains every fragment.
void ExpectError(const std::string& yaml, absl::StatusCode code,
                 const std::vector<std::string>& fragments,
                 const std::vector<std::string>& overrides = {}) {
  SCOPED_TRACE(yaml);
  absl::StatusOr<JobConfig> config =
      ParseJobConfig(yaml, "job.yaml", overrides);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), code) << config.status();
  const std::string message(config.status().message());
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  for (const std::string& fragment : fragments) {
    EXPECT_THAT(message, HasSubstr(fragment));
  }
}

TEST(ConfigTest, DefaultConfigIsValid) {
  EXPECT_TRUE(ValidateJobConfig(JobConfig{}).ok());
}

TEST(ConfigTest, EmptyMapGivesDefaults) {
  absl::StatusOr<JobConfig> config = ParseJobConfig("{}\n", "job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  JobConfig expected;
  expected.source_path = "job.yaml";
  ExpectSameConfig(*config, expected);
}

// A file with no keys is a mistake (a wrong or unsaved file), not a request
// for the default job: one line, whatever the overrides.
TEST(ConfigTest, RefusesTextWithNoKeys) {
  for (const char* text :
       {"", "\n", "  \n\t\n", "# nothing here\n\n   # at all\n", "---\n"}) {
    SCOPED_TRACE(text);
    for (const std::vector<std::string>& overrides :
         {std::vector<std::string>{},
          std::vector<std::string>{"rollout.top_k=3"}}) {
      absl::StatusOr<JobConfig> config =
          ParseJobConfig(text, "job.yaml", overrides);
      ASSERT_FALSE(config.ok());
      EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(std::string(config.status().message()),
                "job.yaml: the file is empty (no keys); a job needs at least "
                "one key (write '{}' to run every default)");
    }
  }
}

TEST(ConfigTest, LoadJobConfigRefusesEmptyFile) {
  for (const char* content : {"", "# only a comment\n\n"}) {
    SCOPED_TRACE(content);
    const std::string path = WriteTempFile("empty.yaml", content);
    absl::StatusOr<JobConfig> config = LoadJobConfig(path);
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(
        std::string(config.status().message()),
        StartsWith(absl::StrCat(path, ": the file is empty (no keys); ")));
  }
}

TEST(ConfigTest, EmptySectionsAndNullStringsAreAccepted) {
  absl::StatusOr<JobConfig> config = ParseJobConfig(
      "init_checkpoint:\nmodel:\n  # all defaults\ntask:\n  reward: ~\n",
      "job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->init_checkpoint, "");
  EXPECT_EQ(config->model.d_model, 128);
  EXPECT_EQ(config->task.reward, "");
}

TEST(ConfigTest, LoadsEveryField) {
  const std::string ckpt = WriteTempFile("every_ckpt.pt", "x");
  const std::string train = WriteTempFile("every_train.jsonl", "{}\n");
  const std::string eval = WriteTempFile("every_eval.jsonl", "{}\n");
  const std::string yaml = absl::StrCat(R"(
name: my job
seed: 7
device: cuda:1
num_threads: 8
output_dir: runs/my job
init_checkpoint: )",
                                        ckpt, R"(
model:
  d_model: 64
  n_layers: 2
  n_heads: 2
  d_ff: 256
  max_seq_len: 96
  rope_theta: 500000.0
  norm_eps: 1.0e-6
  init_std: 0.01
  moe_experts: 8
  moe_top_k: 1
  moe_capacity_factor: 1.25
  moe_aux_loss_coef: 0.02
  moe_z_loss_coef: 0.0005
  moe_shared_expert: true
  moe_d_ff: 96
task:
  name: jsonl
  seed: -5
  eval_size: 50
  min_digits: 2
  max_digits: 5
  num_operands: 4
  max_operand: 99
  long_fraction: 0.25
  long_max: 10
  train_path: )",
                                        train, R"(
  eval_path: )",
                                        eval, R"(
  reward: exact_match
rollout:
  prompts_per_step: 32
  group_size: 4
  max_new_tokens: 24
  temperature: 0.7
  top_k: 50
  top_p: 0.95
algorithm:
  adv_estimator: rloo
  norm_adv_by_std: false
  gamma: 0.99
  clip_ratio_low: 0.1
  clip_ratio_high: 0.28
  clip_ratio_c: 10
  loss_agg_mode: seq-mean-token-sum-norm
  kl_coef: 0.05
  kl_estimator: k2
  kl_mode: reward
  entropy_coef: 0.001
  ppo_epochs: 3
  decoupled_loss: true
  behaviour_weight_cap: 2.5
  behaviour_weight_level: sequence
  behaviour_weight_mode: mask
optim:
  lr: 3e-4
  weight_decay: 0.1
  beta1: 0.8
  beta2: 0.95
  eps: 1e-6
  grad_clip: 0
  warmup_steps: 10
  mini_batch_size: 32
  micro_batch_size: 16
run:
  total_steps: 500
  eval_every: 25
  checkpoint_every: 100
  log_every: 5
sft:
  steps: 1000
  batch_size: 128
  lr: 5e-4
  warmup_steps: 7
  eval_every: 200
placement:
  mode: disaggregated
  super_nodes: 4
  cards_per_super_node: 8
  rollout_cards_per_super_node: 6
  fail_if_unplaceable: true
)");
  absl::StatusOr<JobConfig> config = ParseJobConfig(yaml, "full.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  const JobConfig& c = *config;
  EXPECT_EQ(c.name, "my job");
  EXPECT_EQ(c.source_path, "full.yaml");
  EXPECT_EQ(c.seed, 7);
  EXPECT_EQ(c.device, "cuda:1");
  EXPECT_EQ(c.num_threads, 8);
  EXPECT_EQ(c.output_dir, "runs/my job");
  EXPECT_EQ(c.init_checkpoint, ckpt);
  EXPECT_EQ(c.model.d_model, 64);
  EXPECT_EQ(c.model.n_layers, 2);
  EXPECT_EQ(c.model.n_heads, 2);
  EXPECT_EQ(c.model.d_ff, 256);
  EXPECT_EQ(c.model.max_seq_len, 96);
  EXPECT_EQ(c.model.rope_theta, 500000.0);
  EXPECT_EQ(c.model.norm_eps, 1.0e-6);
  EXPECT_EQ(c.model.init_std, 0.01);
  EXPECT_EQ(c.model.moe_experts, 8);
  EXPECT_EQ(c.model.moe_top_k, 1);
  EXPECT_EQ(c.model.moe_capacity_factor, 1.25);
  EXPECT_EQ(c.model.moe_aux_loss_coef, 0.02);
  EXPECT_EQ(c.model.moe_z_loss_coef, 0.0005);
  EXPECT_TRUE(c.model.moe_shared_expert);
  EXPECT_EQ(c.model.moe_d_ff, 96);
  EXPECT_EQ(c.task.name, "jsonl");
  EXPECT_EQ(c.task.seed, -5);
  EXPECT_EQ(c.task.eval_size, 50);
  EXPECT_EQ(c.task.min_digits, 2);
  EXPECT_EQ(c.task.max_digits, 5);
  EXPECT_EQ(c.task.num_operands, 4);
  EXPECT_EQ(c.task.max_operand, 99);
  EXPECT_EQ(c.task.long_fraction, 0.25);
  EXPECT_EQ(c.task.long_max, 10);
  EXPECT_EQ(c.task.train_path, train);
  EXPECT_EQ(c.task.eval_path, eval);
  EXPECT_EQ(c.task.reward, "exact_match");
  EXPECT_EQ(c.rollout.prompts_per_step, 32);
  EXPECT_EQ(c.rollout.group_size, 4);
  EXPECT_EQ(c.rollout.max_new_tokens, 24);
  EXPECT_EQ(c.rollout.temperature, 0.7);
  EXPECT_EQ(c.rollout.top_k, 50);
  EXPECT_EQ(c.rollout.top_p, 0.95);
  EXPECT_EQ(c.algorithm.adv_estimator, AdvEstimator::kRloo);
  EXPECT_FALSE(c.algorithm.norm_adv_by_std);
  EXPECT_EQ(c.algorithm.gamma, 0.99);
  EXPECT_EQ(c.algorithm.clip_ratio_low, 0.1);
  EXPECT_EQ(c.algorithm.clip_ratio_high, 0.28);
  EXPECT_EQ(c.algorithm.clip_ratio_c, 10.0);
  EXPECT_EQ(c.algorithm.loss_agg_mode, LossAggMode::kSeqMeanTokenSumNorm);
  EXPECT_EQ(c.algorithm.kl_coef, 0.05);
  EXPECT_EQ(c.algorithm.kl_estimator, KlEstimator::kK2);
  EXPECT_EQ(c.algorithm.kl_mode, KlMode::kReward);
  EXPECT_EQ(c.algorithm.entropy_coef, 0.001);
  EXPECT_EQ(c.algorithm.ppo_epochs, 3);
  EXPECT_TRUE(c.algorithm.decoupled_loss);
  EXPECT_EQ(c.algorithm.behaviour_weight_cap, 2.5);
  EXPECT_EQ(c.algorithm.behaviour_weight_level,
            BehaviourWeightLevel::kSequence);
  EXPECT_EQ(c.algorithm.behaviour_weight_mode, BehaviourWeightMode::kMask);
  EXPECT_EQ(c.optim.lr, 3e-4);
  EXPECT_EQ(c.optim.weight_decay, 0.1);
  EXPECT_EQ(c.optim.beta1, 0.8);
  EXPECT_EQ(c.optim.beta2, 0.95);
  EXPECT_EQ(c.optim.eps, 1e-6);
  EXPECT_EQ(c.optim.grad_clip, 0.0);
  EXPECT_EQ(c.optim.warmup_steps, 10);
  EXPECT_EQ(c.optim.mini_batch_size, 32);
  EXPECT_EQ(c.optim.micro_batch_size, 16);
  EXPECT_EQ(c.run.total_steps, 500);
  EXPECT_EQ(c.run.eval_every, 25);
  EXPECT_EQ(c.run.checkpoint_every, 100);
  EXPECT_EQ(c.run.log_every, 5);
  EXPECT_EQ(c.sft.steps, 1000);
  EXPECT_EQ(c.sft.batch_size, 128);
  EXPECT_EQ(c.sft.lr, 5e-4);
  EXPECT_EQ(c.sft.warmup_steps, 7);
  EXPECT_EQ(c.sft.eval_every, 200);
  EXPECT_EQ(c.placement.mode, PlacementMode::kDisaggregated);
  EXPECT_EQ(c.placement.super_nodes, 4);
  EXPECT_EQ(c.placement.cards_per_super_node, 8);
  EXPECT_EQ(c.placement.rollout_cards_per_super_node, 6);
  EXPECT_TRUE(c.placement.fail_if_unplaceable);
}

TEST(ConfigTest, PlacementDefaultsToOneColocatedCard) {
  absl::StatusOr<JobConfig> config = ParseJobConfig("placement:\n", "job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->placement.mode, PlacementMode::kColocatedSync);
  EXPECT_EQ(config->placement.super_nodes, 1);
  EXPECT_EQ(config->placement.cards_per_super_node, 1);
  EXPECT_EQ(config->placement.rollout_cards_per_super_node, 0);
  EXPECT_FALSE(config->placement.fail_if_unplaceable);
}

TEST(ConfigTest, LoadsPlacementModesAndOverrides) {
  absl::StatusOr<JobConfig> config = ParseJobConfig(
      "placement:\n  mode: fused\n  super_nodes: 2\n"
      "  cards_per_super_node: 16\n",
      "job.yaml", {"placement.super_nodes=4096"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->placement.mode, PlacementMode::kFused);
  EXPECT_EQ(config->placement.super_nodes, 4096);
  EXPECT_EQ(config->placement.cards_per_super_node, 16);

  // Switching to disaggregated needs the rollout split too.
  ExpectError("placement:\n  cards_per_super_node: 4\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: placement.rollout_cards_per_super_node: "
               "disaggregated needs 1..cards_per_super_node-1 rollout cards, "
               "got 0"},
              {"placement.mode=disaggregated"});
  config = ParseJobConfig("placement:\n  cards_per_super_node: 4\n", "job.yaml",
                          {"placement.mode=disaggregated",
                           "placement.rollout_cards_per_super_node=1"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->placement.rollout_cards_per_super_node, 1);

  ExpectError("placement:\n  mode: hybrid\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: placement.mode: must be one of colocated-sync, "
               "disaggregated, fused; got 'hybrid'"});
  ExpectError("placement:\n  super_node: 2\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: placement.super_node: unknown key (did you mean "
               "'super_nodes'?)"});
}

TEST(ConfigTest, LoadsMemorySection) {
  absl::StatusOr<JobConfig> config = ParseJobConfig("memory:\n", "job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->memory.card_budget_mib, 0.0);
  EXPECT_EQ(config->memory.offload_optimizer, OffloadPolicy::kAuto);

  config = ParseJobConfig(
      "memory:\n  card_budget_mib: 40960.5\n  offload_optimizer: never\n",
      "job.yaml", {"memory.card_budget_mib=81920"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->memory.card_budget_mib, 81920.0);
  EXPECT_EQ(config->memory.offload_optimizer, OffloadPolicy::kNever);

  ExpectError("memory:\n  card_budget_mib: -1\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: memory.card_budget_mib: must be in [0, "
               "1099511627776], got -1"});
  ExpectError("memory:\n  card_budget_mib: lots\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: memory.card_budget_mib: expected a number, got "
               "'lots'"});
  ExpectError("memory:\n  offload_optimizer: always\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: memory.offload_optimizer: must be one of never, "
               "auto; got 'always'"});
  ExpectError("memory:\n  card_budget_mb: 64\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: memory.card_budget_mb: unknown key (did you mean "
               "'card_budget_mib'?)"});
  ExpectError("{}", absl::StatusCode::kInvalidArgument,
              {"--set memory.offload_optimizer=sometimes: must be one of "
               "never, auto; got 'sometimes'"},
              {"memory.offload_optimizer=sometimes"});
}

TEST(ConfigTest, LoadsActivationsSection) {
  absl::StatusOr<JobConfig> config = ParseJobConfig("model:\n", "job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model.activations.policy, ActivationPolicy::kKeep);
  EXPECT_EQ(config->model.activations.layers, "");

  config = ParseJobConfig(
      "model:\n  n_layers: 3\n  activations:\n    policy: recompute\n"
      "    mlp: swap\n    layers: \"0: mlp=keep, norm=swap; 2: "
      "attention=keep\"\n",
      "job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model.activations.policy, ActivationPolicy::kRecompute);
  EXPECT_EQ(config->model.activations.mlp, SubBlockActivation::kSwap);
  EXPECT_EQ(config->model.activations.attention, SubBlockActivation::kDefault);
  {
    // Written and read back: the unset sub-blocks stay unset ("").
    auto again = ParseJobConfig(JobConfigToYaml(*config), "job.yaml");
    ASSERT_TRUE(again.ok()) << again.status();
    ExpectSameConfig(*config, *again);
    auto empty =
        ParseJobConfig("model:\n  activations:\n    norm:\n", "job.yaml");
    ASSERT_TRUE(empty.ok()) << empty.status();
    EXPECT_EQ(empty->model.activations.norm, SubBlockActivation::kDefault);
  }
  auto plan = ResolveActivationPlan(config->model.activations, 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 3u);
  EXPECT_EQ((*plan)[0].attention, ActivationAction::kRecompute);
  EXPECT_EQ((*plan)[0].mlp, ActivationAction::kKeep);
  EXPECT_EQ((*plan)[0].norm, ActivationAction::kSwap);
  EXPECT_EQ((*plan)[1].attention, ActivationAction::kRecompute);
  EXPECT_EQ((*plan)[1].mlp, ActivationAction::kSwap);
  EXPECT_EQ((*plan)[1].norm, ActivationAction::kRecompute);
  EXPECT_EQ((*plan)[2].attention, ActivationAction::kKeep);
  EXPECT_EQ((*plan)[2].mlp, ActivationAction::kSwap);

  // auto: the resolver gives keep everywhere until the planner measures.
  config = ParseJobConfig(
      "model:\n  activations:\n    policy: auto\n    budget_mib: 512\n",
      "job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  plan = ResolveActivationPlan(config->model.activations, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 4u);
  EXPECT_EQ((*plan)[3].mlp, ActivationAction::kKeep);
  ExpectError(
      "model:\n  activations:\n    policy: auto\n    budget_mib: 64\n"
      "    mlp: keep\n",
      absl::StatusCode::kInvalidArgument,
      {"job.yaml: model.activations: under policy auto the planner chooses"});

  ExpectError("model:\n  activations:\n    policy: checkpoint\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: model.activations.policy: must be one of keep, "
               "recompute, swap, auto; got 'checkpoint'"});
  ExpectError("model:\n  activations:\n    mlp: offload\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: model.activations.mlp: must be keep, recompute or "
               "swap",
               "got 'offload'"});
  ExpectError("model:\n  activations:\n    layers: \"4: mlp=keep\"\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: model.activations.layers: layer 4 out of range: "
               "model.n_layers is 4"});
  ExpectError("model:\n  activations:\n    layers: \"1: mlp=drop\"\n",
              absl::StatusCode::kInvalidArgument,
              {"model.activations.layers: layer 1: unknown action 'drop' for "
               "mlp"});
  ExpectError("model:\n  activations:\n    layers: \"1: ffn=keep\"\n",
              absl::StatusCode::kInvalidArgument,
              {"model.activations.layers: layer 1: bad item 'ffn=keep'"});
  ExpectError("model:\n  activations:\n    layers: \"mlp=keep\"\n",
              absl::StatusCode::kInvalidArgument,
              {"model.activations.layers: bad entry 'mlp=keep'"});
  ExpectError(
      "model:\n  activations:\n    layers: \"1: mlp=keep; 1: norm=swap\"\n",
      absl::StatusCode::kInvalidArgument,
      {"model.activations.layers: layer 1 listed twice"});
  ExpectError("model:\n  activations:\n    policy: auto\n",
              absl::StatusCode::kInvalidArgument,
              {"model.activations.budget_mib: must be > 0 when "
               "model.activations.policy is auto"});
  ExpectError("model:\n  activations:\n    recompute: all\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: model.activations.recompute: unknown key"});
}

TEST(ConfigTest, LoadJobConfigReadsFileAndSetsSourcePath) {
  const std::string path =
      WriteTempFile("load.yaml",
                    "name: from_file\nrollout:\n  top_k: 5\n"
                    "algorithm:\n  rollout_correction: tis\n");
  absl::StatusOr<JobConfig> config = LoadJobConfig(path, {"rollout.top_k=7"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->name, "from_file");
  EXPECT_EQ(config->rollout.top_k, 7);
  EXPECT_EQ(config->source_path, path);
}

TEST(ConfigTest, LoadJobConfigReportsMissingFile) {
  const std::string path = MissingPath("missing.yaml");
  absl::StatusOr<JobConfig> config = LoadJobConfig(path);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(config.status().message()),
            absl::StrCat(path,
                         ": cannot open config file (No such file or "
                         "directory)"));
}

TEST(ConfigTest, LoadJobConfigErrorsNameTheFile) {
  const std::string path =
      WriteTempFile("bad.yaml", "rollout:\n  temperature: hot\n");
  absl::StatusOr<JobConfig> config = LoadJobConfig(path);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(config.status().message()),
            absl::StrCat(path,
                         ": rollout.temperature: expected a number, got "
                         "'hot'"));
}

TEST(ConfigTest, RejectsTopLevelNonMap) {
  ExpectError("3\n", absl::StatusCode::kInvalidArgument,
              {"job.yaml: ", "expected a map", "'3'"});
  ExpectError("- a\n- b\n", absl::StatusCode::kInvalidArgument,
              {"job.yaml: ", "expected a map", "a sequence"});
}

TEST(ConfigTest, RejectsMultipleDocuments) {
  ExpectError("name: a\n---\nname: b\n", absl::StatusCode::kInvalidArgument,
              {"job.yaml: ", "one YAML document"});
}

TEST(ConfigTest, RejectsUnknownKeyWithSuggestion) {
  absl::StatusOr<JobConfig> config =
      ParseJobConfig("rollout:\n  temprature: 0.7\n", "job.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(config.status().message()),
            "job.yaml: rollout.temprature: unknown key (did you mean "
            "'temperature'?)");
  ExpectError("nmae: x\n", absl::StatusCode::kInvalidArgument,
              {"job.yaml: nmae: unknown key (did you mean 'name'?)"});
  ExpectError("modle:\n  d_model: 64\n", absl::StatusCode::kInvalidArgument,
              {"job.yaml: modle: unknown key (did you mean 'model'?)"});
  ExpectError("optim:\n  betta2: 0.9\n", absl::StatusCode::kInvalidArgument,
              {"job.yaml: optim.betta2: unknown key (did you mean 'beta2'?)"});
  // A simulator config given to a job command says which command reads it.
  ExpectError("job:\n  name: sim\n", absl::StatusCode::kInvalidArgument,
              {"job.yaml: job: unknown key: this looks like a `fusionrl "
               "simulate` config (the job nested under job:); run fusionrl "
               "simulate on it"});
}

TEST(ConfigTest, RejectsUnknownKeyListingKnownKeys) {
  ExpectError("run:\n  wallclock_limit: 5\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: run.wallclock_limit: unknown key",
               "total_steps, eval_every, checkpoint_every, log_every"});
}

TEST(ConfigTest, RejectsDuplicateKey) {
  ExpectError("model:\n  d_model: 64\n  d_model: 32\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: model.d_model: duplicate key"});
}

TEST(ConfigTest, RejectsWrongTypes) {
  struct Case {
    std::string yaml;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"rollout:\n  temperature: hot\n",
       "job.yaml: rollout.temperature: expected a number, got 'hot'"},
      {"rollout:\n  temperature: [1]\n",
       "job.yaml: rollout.temperature: expected a number, got a sequence"},
      {"rollout:\n  temperature: .nan\n",
       "job.yaml: rollout.temperature: expected a finite number, got '.nan'"},
      {"model:\n  d_model: 1.5\n",
       "job.yaml: model.d_model: expected an integer, got '1.5'"},
      {"model:\n  d_model:\n",
       "job.yaml: model.d_model: expected an integer, got an empty value"},
      {"model:\n  d_model: 99999999999\n",
       "job.yaml: model.d_model: integer out of range, got 99999999999"},
      {"seed: 99999999999999999999\n",
       "job.yaml: seed: expected an integer, got '99999999999999999999'"},
      {"algorithm:\n  norm_adv_by_std: yes\n",
       "job.yaml: algorithm.norm_adv_by_std: expected true or false, got "
       "'yes'"},
      {"algorithm:\n  norm_adv_by_std: 1\n",
       "job.yaml: algorithm.norm_adv_by_std: expected true or false, got "
       "'1'"},
      {"name: [a, b]\n", "job.yaml: name: expected a string, got a sequence"},
      {"task:\n  name: {a: 1}\n",
       "job.yaml: task.name: expected a string, got a map"},
      {"model: 3\n", "job.yaml: model: expected a map, got '3'"},
      {"sft: [1, 2]\n", "job.yaml: sft: expected a map, got a sequence"},
      {"placement:\n  fail_if_unplaceable: maybe\n",
       "job.yaml: placement.fail_if_unplaceable: expected true or false, got "
       "'maybe'"},
      {"placement:\n  super_nodes: two\n",
       "job.yaml: placement.super_nodes: expected an integer, got 'two'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml);
    absl::StatusOr<JobConfig> config = ParseJobConfig(c.yaml, "job.yaml");
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(config.status().message()), c.message);
  }
}

TEST(ConfigTest, AcceptsYamlBoolSpellingsAndQuotedNumbers) {
  absl::StatusOr<JobConfig> config = ParseJobConfig(
      "algorithm:\n  norm_adv_by_std: False\n  rollout_correction: tis\n"
      "rollout:\n  temperature: '0.5'\n  top_k: +3\n",
      "job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->algorithm.norm_adv_by_std);
  EXPECT_EQ(config->rollout.temperature, 0.5);
  EXPECT_EQ(config->rollout.top_k, 3);
}

// Top-k / top-p behaviour log-probs are the truncated distribution's: the
// plain PPO ratio would take them as the trainer's, so sampling with either
// needs a recomputed proximal policy (decoupled PPO or a rollout correction).
TEST(ConfigTest, TruncatedSamplingNeedsARecomputedProximalPolicy) {
  for (const char* sampling : {"  top_k: 20\n", "  top_p: 0.9\n"}) {
    SCOPED_TRACE(sampling);
    const std::string rollout = absl::StrCat("rollout:\n", sampling);
    absl::StatusOr<JobConfig> plain = ParseJobConfig(rollout, "job.yaml");
    ASSERT_FALSE(plain.ok());
    EXPECT_THAT(std::string(plain.status().message()),
                HasSubstr("needs the trainer to recompute the proximal "
                          "log-probs"));
    for (const char* fix : {"algorithm:\n  rollout_correction: tis\n",
                            "algorithm:\n  decoupled_loss: true\n",
                            "rollout:\n  temperature: 0\n"}) {
      SCOPED_TRACE(fix);
      const std::string text =
          std::string(fix).rfind("rollout", 0) == 0
              ? absl::StrCat("rollout:\n", sampling, "  temperature: 0\n")
              : absl::StrCat(rollout, fix);
      EXPECT_TRUE(ParseJobConfig(text, "job.yaml").ok()) << text;
    }
  }
}

TEST(ConfigTest, RolloutCorrectionAndDecoupledLossAreOneWeight) {
  absl::StatusOr<JobConfig> both = ParseJobConfig(
      "algorithm:\n  decoupled_loss: true\n  rollout_correction: mis\n",
      "job.yaml");
  ASSERT_FALSE(both.ok());
  EXPECT_THAT(std::string(both.status().message()),
              HasSubstr("job.yaml: algorithm.rollout_correction: mis with "
                        "algorithm.decoupled_loss: true"));
  // A rollout correction is a behaviour weight: it also admits a lag.
  EXPECT_TRUE(ParseJobConfig("algorithm:\n  rollout_correction: tis\n"
                             "placement:\n  mode: fused\n"
                             "stalesync:\n  max_policy_lag: 1\n",
                             "job.yaml")
                  .ok());
  absl::StatusOr<JobConfig> bad_cap =
      ParseJobConfig("algorithm:\n  rollout_correction_cap: 1\n", "job.yaml");
  ASSERT_FALSE(bad_cap.ok());
  EXPECT_THAT(std::string(bad_cap.status().message()),
              HasSubstr("algorithm.rollout_correction_cap: must be > 1"));
}

TEST(ConfigTest, OverlongSettingsAreParsedAndChecked) {
  absl::StatusOr<JobConfig> c = ParseJobConfig(
      "rollout:\n  max_new_tokens: 32\n  overlong: penalize\n"
      "  overlong_buffer: 8\n  overlong_penalty: 0.5\n",
      "job.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rollout.overlong, OverlongMode::kPenalize);
  EXPECT_EQ(c->rollout.overlong_buffer, 8);
  EXPECT_EQ(c->rollout.overlong_penalty, 0.5);
  absl::StatusOr<JobConfig> unknown =
      ParseJobConfig("rollout:\n  overlong: drop\n", "job.yaml");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("rollout.overlong: must be one of keep, mask, "
                        "penalize; got 'drop'"));
  absl::StatusOr<JobConfig> long_buffer = ParseJobConfig(
      "rollout:\n  max_new_tokens: 8\n  overlong_buffer: 9\n", "job.yaml");
  ASSERT_FALSE(long_buffer.ok());
  EXPECT_THAT(std::string(long_buffer.status().message()),
              HasSubstr("rollout.overlong_buffer: must be <= "
                        "rollout.max_new_tokens (8), got 9"));
}

TEST(ConfigTest, EnvSettingsAreParsedAndChecked) {
  absl::StatusOr<JobConfig> c = ParseJobConfig(
      "env:\n  name: remote\n  address: 127.0.0.1:5000,10.0.0.2:5000\n"
      "  tool_format: hermes\n  max_turns: 6\n  max_episode_tokens: 64\n"
      "  call_deadline_seconds: 2.5\n  on_failure: drop\n"
      "  admit_after_steps: 8\n",
      "job.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->env.name, "remote");
  EXPECT_EQ(c->env.address, "127.0.0.1:5000,10.0.0.2:5000");
  EXPECT_EQ(c->env.tool_format, "hermes");
  EXPECT_EQ(c->env.max_turns, 6);
  EXPECT_EQ(c->env.max_episode_tokens, 64);
  EXPECT_EQ(c->env.call_deadline_seconds, 2.5);
  EXPECT_EQ(c->env.on_failure, "drop");
  EXPECT_EQ(c->env.admit_after_steps, 8);
  const std::pair<const char*, const char*> bad[] = {
      {"env:\n  name: remote\n",
       "env.address: env.name: remote needs the environment server's "
       "host:port"},
      {"env:\n  address: 127.0.0.1:5000\n",
       "env.address: is set but env.name is not"},
      {"rollout:\n  max_new_tokens: 16\n"
       "env:\n  name: calculator\n  max_episode_tokens: 8\n",
       "env.max_episode_tokens: must be 0 or >= rollout.max_new_tokens (16), "
       "got 8"},
      {"env:\n  name: calculator\nplacement:\n  mode: fused\n"
       "stalesync:\n  max_policy_lag: 2\n  partial_rollout_tokens: 4\n"
       "algorithm:\n  decoupled_loss: true\n",
       "stalesync.partial_rollout_tokens: must be 0 with env.name set"},
      {"env:\n  name: calculator\nrollout:\n  overlong: penalize\n",
       "rollout.overlong: penalize ramps a response's reward"},
      {"env:\n  name: calculator\n  on_failure: retry\n",
       "env.on_failure: must be one of zero, drop; got 'retry'"},
      {"env:\n  name: calculator\n  max_turns: 0\n", "env.max_turns: "},
      {"env:\n  name: calculator\n  call_deadline_seconds: 0\n",
       "env.call_deadline_seconds: "},
  };
  for (const auto& [yaml, message] : bad) {
    absl::StatusOr<JobConfig> r = ParseJobConfig(yaml, "job.yaml");
    ASSERT_FALSE(r.ok()) << yaml;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(message)) << yaml;
  }
}

TEST(ConfigTest, RejectsOutOfRangeValue) {
  absl::StatusOr<JobConfig> config =
      ParseJobConfig("rollout:\n  top_p: 1.5\n", "job.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(config.status().message()),
            "job.yaml: rollout.top_p: must be in (0, 1], got 1.5");
}

TEST(ConfigTest, RejectsEnumOutsideSet) {
  absl::StatusOr<JobConfig> config =
      ParseJobConfig("algorithm:\n  adv_estimator: ppo2\n", "job.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(config.status().message()),
            "job.yaml: algorithm.adv_estimator: must be one of grpo, rloo, "
            "reinforce_pp; got 'ppo2'");
}

TEST(ConfigTest, BehaviourWeightModeIsParsedOnceAsAnEnum) {
  absl::StatusOr<JobConfig> defaults = ParseJobConfig("{}", "job.yaml");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->algorithm.behaviour_weight_mode,
            BehaviourWeightMode::kTruncate);
  for (BehaviourWeightMode mode :
       {BehaviourWeightMode::kTruncate, BehaviourWeightMode::kMask}) {
    const std::string name = BehaviourWeightModeName(mode);
    absl::StatusOr<BehaviourWeightMode> parsed = ParseBehaviourWeightMode(name);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, mode);
    absl::StatusOr<JobConfig> config = ParseJobConfig(
        absl::StrCat("algorithm:\n  behaviour_weight_mode: ", name, "\n"),
        "job.yaml");
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->algorithm.behaviour_weight_mode, mode);
    EXPECT_THAT(JobConfigToYaml(*config),
                HasSubstr(absl::StrCat("behaviour_weight_mode: ", name, "\n")));
  }
  absl::StatusOr<JobConfig> config = ParseJobConfig(
      "{}", "job.yaml", {"algorithm.behaviour_weight_mode=mask"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->algorithm.behaviour_weight_mode,
            BehaviourWeightMode::kMask);
}

TEST(ConfigTest, RejectsUnknownBehaviourWeightMode) {
  absl::StatusOr<JobConfig> config =
      ParseJobConfig("algorithm:\n  behaviour_weight_mode: clip\n", "job.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(config.status().message()),
            "job.yaml: algorithm.behaviour_weight_mode: must be one of "
            "truncate, mask; got 'clip'");
  ExpectError("{}", absl::StatusCode::kInvalidArgument,
              {"--set algorithm.behaviour_weight_mode=Mask: must be one of "
               "truncate, mask; got 'Mask'"},
              {"algorithm.behaviour_weight_mode=Mask"});
  ExpectError("algorithm:\n  behaviour_weight_mode: [mask]\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: algorithm.behaviour_weight_mode: expected a string, "
               "got a sequence"});
  // An empty value reads as "": an enum without that spelling names its
  // values (a sub-block's activation setting has it: the policy's action).
  ExpectError("algorithm:\n  behaviour_weight_mode:\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: algorithm.behaviour_weight_mode: must be one of "
               "truncate, mask; got ''"});
  EXPECT_FALSE(ParseBehaviourWeightMode("").ok());
  EXPECT_STREQ(BehaviourWeightModeName(static_cast<BehaviourWeightMode>(7)),
               "?");
  // A value set in code outside the enum is caught by validation.
  JobConfig c;
  c.algorithm.behaviour_weight_mode = static_cast<BehaviourWeightMode>(7);
  const absl::Status status = ValidateJobConfig(c);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("algorithm.behaviour_weight_mode: not a valid value"));
}

// Every mode, estimator and over-stale policy is an enum parsed once by the
// reader: each YAML spelling parses to its enumerator and is emitted back
// unchanged, and a bad spelling keeps the message of the old string keys.
TEST(ConfigTest, ModesAndEstimatorsAreParsedOnceAsEnums) {
  struct Case {
    std::string key;                 // "algorithm.adv_estimator"
    std::vector<std::string> names;  // every spelling, in enum order
    std::function<std::string(const JobConfig&)> name_of;  // via XName()
    std::string bad;      // a spelling that is not one
    std::string message;  // its error, after "job.yaml: <key>: "
  };
  const std::vector<Case> cases = {
      {"algorithm.adv_estimator",
       {"grpo", "rloo", "reinforce_pp"},
       [](const JobConfig& c) {
         return AdvEstimatorName(c.algorithm.adv_estimator);
       },
       "ppo2",
       "must be one of grpo, rloo, reinforce_pp; got 'ppo2'"},
      {"algorithm.loss_agg_mode",
       {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
        "seq-mean-token-sum-norm"},
       [](const JobConfig& c) {
         return LossAggModeName(c.algorithm.loss_agg_mode);
       },
       "mean",
       "must be one of token-mean, seq-mean-token-mean, seq-mean-token-sum, "
       "seq-mean-token-sum-norm; got 'mean'"},
      {"algorithm.kl_estimator",
       {"k1", "k2", "k3"},
       [](const JobConfig& c) {
         return KlEstimatorName(c.algorithm.kl_estimator);
       },
       "k4",
       "must be one of k1, k2, k3; got 'k4'"},
      {"algorithm.kl_mode",
       {"loss", "reward"},
       [](const JobConfig& c) { return KlModeName(c.algorithm.kl_mode); },
       "both",
       "must be one of loss, reward; got 'both'"},
      {"algorithm.behaviour_weight_level",
       {"token", "sequence"},
       [](const JobConfig& c) {
         return BehaviourWeightLevelName(c.algorithm.behaviour_weight_level);
       },
       "tokens",
       "must be one of token, sequence; got 'tokens'"},
      {"placement.mode",
       {"colocated-sync", "disaggregated", "fused"},
       [](const JobConfig& c) { return PlacementModeName(c.placement.mode); },
       "colocated",
       "must be one of colocated-sync, disaggregated, fused; got 'colocated'"},
      {"placement.fused_turns",
       {"auto", "concurrent", "interleaved", "probe"},
       [](const JobConfig& c) {
         return FusedTurnsName(c.placement.fused_turns);
       },
       "alternating",
       "must be one of auto, concurrent, interleaved, probe; got "
       "'alternating'"},
      {"stalesync.over_stale",
       {"regenerate", "drop"},
       [](const JobConfig& c) {
         return OverStalePolicyName(c.stalesync.over_stale);
       },
       "resample",
       "must be one of regenerate, drop; got 'resample'"},
      {"stalesync.rollout_version",
       {"lagged", "newest", "jit"},
       [](const JobConfig& c) {
         return RolloutVersionName(c.stalesync.rollout_version);
       },
       "latest",
       "must be one of lagged, newest, jit; got 'latest'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    const size_t dot = c.key.find('.');
    const std::string section = c.key.substr(0, dot);
    const std::string field = c.key.substr(dot + 1);
    for (const std::string& name : c.names) {
      SCOPED_TRACE(name);
      std::string yaml =
          absl::StrCat(section, ":\n  ", field, ": ", name, "\n");
      if (name == "disaggregated") {
        absl::StrAppend(&yaml, "  cards_per_super_node: 2\n",
                        "  rollout_cards_per_super_node: 1\n");
      }
      if (name == "concurrent" || name == "interleaved" || name == "probe") {
        absl::StrAppend(&yaml, "  mode: fused\nstalesync:\n  ",
                        "max_policy_lag: 1\nalgorithm:\n  ",
                        "decoupled_loss: true\n");
      }
      absl::StatusOr<JobConfig> config = ParseJobConfig(yaml, "job.yaml");
      ASSERT_TRUE(config.ok()) << config.status();
      EXPECT_EQ(c.name_of(*config), name);
      const std::string emitted = JobConfigToYaml(*config);
      EXPECT_THAT(emitted, HasSubstr(absl::StrCat(field, ": ", name, "\n")));
      absl::StatusOr<JobConfig> back = ParseJobConfig(emitted, "job.yaml");
      ASSERT_TRUE(back.ok()) << back.status();
      ExpectSameConfig(*back, *config);
    }
    // A bad spelling in the file, quoted empty, or given as an override.
    ExpectError(absl::StrCat(section, ":\n  ", field, ": ", c.bad, "\n"),
                absl::StatusCode::kInvalidArgument,
                {absl::StrCat("job.yaml: ", c.key, ": ", c.message)});
    const std::string empty_message =
        absl::StrCat(c.message.substr(0, c.message.rfind("got '")), "got ''");
    ExpectError(absl::StrCat(section, ":\n  ", field, ": \"\"\n"),
                absl::StatusCode::kInvalidArgument,
                {absl::StrCat("job.yaml: ", c.key, ": ", empty_message)});
    ExpectError("{}", absl::StatusCode::kInvalidArgument,
                {absl::StrCat("--set ", c.key, "=", c.bad, ": ", c.message)},
                {absl::StrCat(c.key, "=", c.bad)});
  }
  EXPECT_STREQ(AdvEstimatorName(static_cast<AdvEstimator>(7)), "?");
  EXPECT_STREQ(LossAggModeName(static_cast<LossAggMode>(7)), "?");
  EXPECT_STREQ(KlEstimatorName(static_cast<KlEstimator>(7)), "?");
  EXPECT_STREQ(KlModeName(static_cast<KlMode>(7)), "?");
  EXPECT_STREQ(BehaviourWeightLevelName(static_cast<BehaviourWeightLevel>(7)),
               "?");
  EXPECT_STREQ(PlacementModeName(static_cast<PlacementMode>(7)), "?");
  EXPECT_STREQ(OverStalePolicyName(static_cast<OverStalePolicy>(7)), "?");
  // Case matters, and nothing is a prefix match (these were the engine's
  // own parsers' tests before the config layer parsed the names).
  EXPECT_FALSE(ParsePlacementMode("Fused").ok());
  EXPECT_FALSE(ParseLossAggMode("Token-Mean").ok());
  EXPECT_FALSE(ParseLossAggMode("token-sum").ok());
  EXPECT_FALSE(ParseLossAggMode("").ok());
  EXPECT_FALSE(ParseKlEstimator("low_var_kl").ok());
  EXPECT_FALSE(ParseBehaviourWeightLevel("tokens").ok());
}

// A policy lag without the decoupled loss trains stale samples with the
// plain PPO ratio, a biased update: refused, naming both keys.
TEST(ConfigTest, RefusesPolicyLagWithoutDecoupledLoss) {
  absl::StatusOr<JobConfig> config = ParseJobConfig(
      "placement:\n  mode: fused\nstalesync:\n  max_policy_lag: 2\n",
      "job.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(config.status().message()),
            "job.yaml: stalesync.max_policy_lag: 2 > 0 requires "
            "algorithm.decoupled_loss: true (samples from an older policy "
            "trained with the plain PPO ratio give a biased update); set "
            "algorithm.decoupled_loss: true (or algorithm.rollout_correction: "
            "tis | mis), or stalesync.max_policy_lag: 0");
  // The override that set the lag is blamed.
  ExpectError("placement:\n  mode: fused\n", absl::StatusCode::kInvalidArgument,
              {"--set stalesync.max_policy_lag=1: 1 > 0 requires "
               "algorithm.decoupled_loss: true"},
              {"stalesync.max_policy_lag=1"});
  // Also for a config built in code.
  JobConfig c;
  c.stalesync.max_policy_lag = 1;
  EXPECT_THAT(std::string(ValidateJobConfig(c).message()),
              HasSubstr("stalesync.max_policy_lag: 1 > 0 requires "
                        "algorithm.decoupled_loss: true"));
  c.algorithm.decoupled_loss = true;
  EXPECT_TRUE(ValidateJobConfig(c).ok());
  config = ParseJobConfig(
      "placement:\n  mode: fused\nstalesync:\n  max_policy_lag: 2\n"
      "algorithm:\n  decoupled_loss: true\n",
      "job.yaml");
  EXPECT_TRUE(config.ok()) << config.status();
  // Lag 0 (synchronous) needs nothing.
  config = ParseJobConfig("stalesync:\n  max_policy_lag: 0\n", "job.yaml");
  EXPECT_TRUE(config.ok()) << config.status();
}

// Partial rollout is refused, naming the key, wherever it cannot act.
// placement.fused_turns pins the card's choice only where there is one
// (worker/step/card_turns.h); elsewhere it would be ignored silently.
TEST(ConfigTest, FusedTurnsNeedAFusedRunWithALagAndSharedThreads) {
  JobConfig c;
  c.placement.mode = PlacementMode::kFused;
  c.stalesync.max_policy_lag = 1;
  c.algorithm.decoupled_loss = true;
  for (FusedTurns t :
       {FusedTurns::kAuto, FusedTurns::kConcurrent, FusedTurns::kInterleaved}) {
    c.placement.fused_turns = t;
    EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  }
  const std::vector<std::function<void(JobConfig&)>> edits = {
      [](JobConfig& j) { j.placement.mode = PlacementMode::kColocatedSync; },
      [](JobConfig& j) { j.stalesync.max_policy_lag = 0; },
      [](JobConfig& j) { j.placement.fused_share_idle_threads = false; },
  };
  for (const auto& edit : edits) {
    JobConfig bad = c;
    bad.placement.fused_turns = FusedTurns::kInterleaved;
    edit(bad);
    EXPECT_THAT(std::string(ValidateJobConfig(bad).message()),
                HasSubstr("placement.fused_turns: interleaved applies only to "
                          "placement.mode fused"));
    bad.placement.fused_turns = FusedTurns::kAuto;
    EXPECT_TRUE(ValidateJobConfig(bad).ok()) << ValidateJobConfig(bad);
  }
}

TEST(ConfigTest, PartialRolloutNeedsAFusedLaggedRunWithALagOfTwo) {
  JobConfig c;
  c.placement.mode = PlacementMode::kFused;
  c.stalesync.max_policy_lag = 2;
  c.algorithm.decoupled_loss = true;
  c.rollout.max_new_tokens = 16;
  c.stalesync.partial_rollout_tokens = 8;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.placement.mode = PlacementMode::kDisaggregated;
  c.placement.cards_per_super_node = 2;
  c.placement.rollout_cards_per_super_node = 1;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  struct Case {
    std::function<void(JobConfig&)> edit;
    std::string says;
  };
  const std::vector<Case> cases = {
      {[](JobConfig& j) { j.placement.mode = PlacementMode::kColocatedSync; },
       "stalesync.partial_rollout_tokens: 8 > 0 needs placement.mode fused "
       "or disaggregated"},
      {[](JobConfig& j) { j.stalesync.max_policy_lag = 1; },
       "stalesync.partial_rollout_tokens: 8 > 0 needs "
       "stalesync.max_policy_lag >= 2 (got 1)"},
      {[](JobConfig& j) {
         j.stalesync.rollout_version = RolloutVersion::kNewest;
       },
       "stalesync.partial_rollout_tokens: 8 > 0 needs "
       "stalesync.rollout_version: lagged"},
      {[](JobConfig& j) { j.rollout.max_new_tokens = 8; },
       "stalesync.partial_rollout_tokens: 8 must be below "
       "rollout.max_new_tokens (8)"},
  };
  for (const Case& k : cases) {
    JobConfig bad = c;
    bad.placement.mode = PlacementMode::kFused;
    bad.placement.cards_per_super_node = 1;
    bad.placement.rollout_cards_per_super_node = 0;
    k.edit(bad);
    EXPECT_THAT(std::string(ValidateJobConfig(bad).message()),
                HasSubstr(k.says));
  }
  ExpectError("stalesync:\n  partial_rollout_tokens: -1\n",
              absl::StatusCode::kInvalidArgument,
              {"stalesync.partial_rollout_tokens"});
}

TEST(ConfigTest, StepsSharingAVersionNeedAFusedLaggedRunWithinTheLag) {
  JobConfig c;
  c.placement.mode = PlacementMode::kFused;
  c.stalesync.max_policy_lag = 2;
  c.algorithm.decoupled_loss = true;
  c.stalesync.steps_per_version = 3;  // s + 1
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  struct Case {
    std::function<void(JobConfig&)> edit;
    std::string says;
  };
  const std::vector<Case> cases = {
      {[](JobConfig& j) {
         j.placement.mode = PlacementMode::kColocatedSync;
         j.stalesync.max_policy_lag = 0;
       },
       "stalesync.steps_per_version: 3 > 1 needs placement.mode fused or "
       "disaggregated"},
      {[](JobConfig& j) { j.stalesync.max_policy_lag = 1; },
       "stalesync.steps_per_version: 3 must be at most "
       "stalesync.max_policy_lag + 1 (2)"},
      {[](JobConfig& j) {
         j.stalesync.rollout_version = RolloutVersion::kJustInTime;
       },
       "stalesync.steps_per_version: 3 > 1 needs "
       "stalesync.rollout_version: lagged"},
      {[](JobConfig& j) {
         j.rollout.max_new_tokens = 16;
         j.stalesync.partial_rollout_tokens = 8;
       },
       "stalesync.steps_per_version: 3 > 1 does not combine with "
       "stalesync.partial_rollout_tokens"},
  };
  for (const Case& k : cases) {
    JobConfig bad = c;
    k.edit(bad);
    EXPECT_THAT(std::string(ValidateJobConfig(bad).message()),
                HasSubstr(k.says));
  }
  ExpectError("stalesync:\n  steps_per_version: 0\n",
              absl::StatusCode::kInvalidArgument,
              {"stalesync.steps_per_version"});
}

TEST(ConfigTest, ReportsYamlSyntaxErrorWithLineAndColumn) {
  absl::StatusOr<JobConfig> config = ParseJobConfig(
      "name: a\nmodel:\n  d_model: 64\n    n_layers: 2\n", "job.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()),
              StartsWith("job.yaml:4:"));
  EXPECT_THAT(std::string(config.status().message()),
              HasSubstr(": invalid YAML: "));
  ExpectError("rollout: [1, 2\n", absl::StatusCode::kInvalidArgument,
              {"job.yaml:", "invalid YAML: end of sequence flow not found"});
}

// yaml-cpp 0.7 alone never returns on these (it allocates null nodes until
// the process is killed); the job description must fail with a position.
TEST(ConfigTest, RejectsAStrayFlowEntryInsteadOfParsingForever) {
  ExpectError(",", absl::StatusCode::kInvalidArgument,
              {"job.yaml:1:1: invalid YAML: ", "a ',' outside [ ] or { }"});
  ExpectError("  , name: a\n", absl::StatusCode::kInvalidArgument,
              {"job.yaml:1:3: invalid YAML: "});
  ExpectError("- a\n,\n", absl::StatusCode::kInvalidArgument,
              {"job.yaml:2:1: invalid YAML: "});
  ExpectError("{}", absl::StatusCode::kInvalidArgument,
              {"--set name=,: invalid YAML value"}, {"name=,"});
}

TEST(ConfigTest, RejectsMissingInitCheckpoint) {
  const std::string ckpt = MissingPath("x.pt");
  absl::StatusOr<JobConfig> config =
      ParseJobConfig(absl::StrCat("init_checkpoint: ", ckpt, "\n"), "job.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(
      std::string(config.status().message()),
      absl::StrCat("job.yaml: init_checkpoint: file not found: '", ckpt, "'"));
}

TEST(ConfigTest, RejectsMissingTaskFiles) {
  const std::string train = WriteTempFile("task_train.jsonl", "{}\n");
  ExpectError(absl::StrCat("task:\n  name: jsonl\n  train_path: ",
                           MissingPath("t.jsonl"), "\n"),
              absl::StatusCode::kNotFound,
              {"job.yaml: task.train_path: file not found: '", "t.jsonl'"});
  ExpectError(absl::StrCat("task:\n  name: jsonl\n  train_path: ", train,
                           "\n  eval_path: ", MissingPath("e.jsonl"), "\n"),
              absl::StatusCode::kNotFound,
              {"job.yaml: task.eval_path: file not found: '", "e.jsonl'"});
  absl::StatusOr<JobConfig> config = ParseJobConfig(
      absl::StrCat("task:\n  name: jsonl\n  train_path: ", train, "\n"),
      "job.yaml");
  EXPECT_TRUE(config.ok()) << config.status();
}

TEST(ConfigTest, JsonlTaskRequiresTrainPath) {
  ExpectError("task:\n  name: jsonl\n", absl::StatusCode::kInvalidArgument,
              {"job.yaml: task.train_path: required when task.name is jsonl"});
}

TEST(ConfigTest, MathTaskRequiresTrainPath) {
  ExpectError("task:\n  name: math\n", absl::StatusCode::kInvalidArgument,
              {"job.yaml: task.train_path: required when task.name is math"});
}

TEST(ConfigTest, LoadsChatTemplateAndSystemPrompt) {
  absl::StatusOr<JobConfig> defaults = ParseJobConfig("{}", "job.yaml");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->task.chat_template, "");  // auto
  EXPECT_EQ(defaults->task.system_prompt, "");
  for (const char* format : {"chatml", "llama3", "none", "''"}) {
    SCOPED_TRACE(format);
    absl::StatusOr<JobConfig> config = ParseJobConfig(
        absl::StrCat("task:\n  chat_template: ", format,
                     "\n  system_prompt: \"Think step by step.\\nThen "
                     "answer.\"\n"),
        "job.yaml");
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->task.chat_template,
              std::string(format) == "''" ? "" : format);
    EXPECT_EQ(config->task.system_prompt, "Think step by step.\nThen answer.");
    // Both keys survive the YAML round trip.
    absl::StatusOr<JobConfig> back =
        ParseJobConfig(JobConfigToYaml(*config), "rt.yaml");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->task.chat_template, config->task.chat_template);
    EXPECT_EQ(back->task.system_prompt, config->task.system_prompt);
  }
}

TEST(ConfigTest, RejectsUnknownChatTemplate) {
  ExpectError("task:\n  chat_template: ChatML\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: task.chat_template: must be chatml, llama3 or none",
               "got 'ChatML'"});
  ExpectError("task:\n  chat_template: [chatml]\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: task.chat_template: expected a string"});
  ExpectError("task:\n  system_prompt: {a: 1}\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: task.system_prompt: expected a string"});
}

TEST(ConfigTest, AppliesOverridesInOrder) {
  absl::StatusOr<JobConfig> config = ParseJobConfig(
      absl::StrCat("init_checkpoint: ", MissingPath("gone.pt"),
                   "\nrollout:\n  temperature: 1.0\n"),
      "job.yaml",
      {"rollout.temperature=0.7", "task.name=reverse",
       "init_checkpoint=", "model.n_layers=2", "model.n_layers=3",
       "name='a: b'", " seed = 42", "algorithm.norm_adv_by_std=false"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rollout.temperature, 0.7);
  EXPECT_EQ(config->task.name, "reverse");
  EXPECT_EQ(config->init_checkpoint, "");
  EXPECT_EQ(config->model.n_layers, 3);
  EXPECT_EQ(config->name, "a: b");
  EXPECT_EQ(config->seed, 42);
  EXPECT_FALSE(config->algorithm.norm_adv_by_std);
  EXPECT_EQ(config->model.d_model, 128);  // untouched
}

TEST(ConfigTest, OverrideCanReplaceAWholeSection) {
  absl::StatusOr<JobConfig> config =
      ParseJobConfig("{}", "job.yaml", {"optim={lr: 0.5, eps: 1e-6}"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->optim.lr, 0.5);
  EXPECT_EQ(config->optim.eps, 1e-6);
}

TEST(ConfigTest, RejectsOverrideWithUnknownKey) {
  absl::StatusOr<JobConfig> config =
      ParseJobConfig("{}", "job.yaml", {"rollout.temprature=0.7"});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(config.status().message()),
            "--set rollout.temprature=0.7: unknown key (did you mean "
            "'temperature'?)");
  ExpectError("{}", absl::StatusCode::kInvalidArgument,
              {"--set rolout.temperature=0.7: rolout: unknown key (did you "
               "mean 'rollout'?)"},
              {"rolout.temperature=0.7"});
}

TEST(ConfigTest, RejectsOverrideWithBadSyntax) {
  for (const char* o : {"foo", "=1", "a..b=1", "model.=3"}) {
    SCOPED_TRACE(o);
    absl::StatusOr<JobConfig> config = ParseJobConfig("{}", "job.yaml", {o});
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(config.status().message()),
              absl::StrCat("--set ", o, ": expected key.path=value"));
  }
  ExpectError("{}", absl::StatusCode::kInvalidArgument,
              {"--set name=[a: invalid YAML value"}, {"name=[a"});
}

TEST(ConfigTest, RejectsOverrideWithWrongType) {
  absl::StatusOr<JobConfig> config =
      ParseJobConfig("{}", "job.yaml", {"rollout.temperature=hot"});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(config.status().message()),
            "--set rollout.temperature=hot: expected a number, got 'hot'");
  ExpectError("{}", absl::StatusCode::kInvalidArgument,
              {"--set model=3: expected a map, got '3'"}, {"model=3"});
  ExpectError("{}", absl::StatusCode::kInvalidArgument,
              {"--set seed.x=1: seed: expected an integer, got a map"},
              {"seed.x=1"});
}

TEST(ConfigTest, RangeErrorsBlameTheOverride) {
  ExpectError("{}", absl::StatusCode::kInvalidArgument,
              {"--set rollout.top_p=1.5: must be in (0, 1], got 1.5"},
              {"rollout.top_p=1.5"});
  ExpectError("{}", absl::StatusCode::kNotFound,
              {"--set init_checkpoint=", ": file not found: '"},
              {absl::StrCat("init_checkpoint=", MissingPath("o.pt"))});
  // A range error in the file that an override does not touch.
  ExpectError("rollout:\n  top_k: -1\n", absl::StatusCode::kInvalidArgument,
              {"job.yaml: rollout.top_k: must be >= 0, got -1"},
              {"rollout.top_p=0.5"});
}

TEST(ConfigTest, RoundTripsThroughYaml) {
  JobConfig c;
  c.source_path = "rt.yaml";
  c.name = "run: 1 # not a comment";
  c.output_dir = "runs/with spaces/and:colon";
  c.device = "cuda:0";
  c.seed = 1234567890123LL;
  c.model.norm_eps = 1e-5;
  c.model.init_std = 1.0 / 3.0;
  c.model.rope_theta = 1e6;
  c.model.moe_experts = 4;
  c.model.moe_capacity_factor = 1.1;
  c.model.moe_shared_expert = true;
  c.model.lora.rank = 8;
  c.model.lora.alpha = 16.5;
  c.model.lora.dropout = 0.05;
  c.model.lora.targets = "q_proj,v_proj";
  c.task.name = "null";
  c.task.reward = "true";
  c.task.seed = -3;
  c.rollout.temperature = 0.1 + 0.2;  // 0.30000000000000004
  c.rollout.top_p = 0.9;
  c.rollout.overlong = OverlongMode::kPenalize;
  c.rollout.overlong_buffer = 4;
  c.rollout.overlong_penalty = 0.5;
  c.algorithm.rollout_correction = RolloutCorrection::kMis;
  c.algorithm.rollout_correction_cap = 3.0;
  c.algorithm.norm_adv_by_std = false;
  c.algorithm.clip_ratio_high = 0.28;
  c.algorithm.gamma = 0.0;
  c.algorithm.behaviour_weight_mode = BehaviourWeightMode::kMask;
  c.optim.lr = 3e-4;
  c.optim.eps = 1e-300;
  c.optim.beta2 = 0.999999999999;
  c.run.eval_every = 0;
  c.sft.steps = 0;
  c.sft.lr = 2.5e-3;
  c.placement.mode = PlacementMode::kDisaggregated;
  c.placement.super_nodes = 3;
  c.placement.cards_per_super_node = 5;
  c.placement.rollout_cards_per_super_node = 2;
  c.placement.fail_if_unplaceable = true;
  c.memory.card_budget_mib = 1536.25;
  c.memory.offload_optimizer = OffloadPolicy::kNever;
  // env.name stays unset: this config's overlong: penalize is refused
  // with an environment (EnvSettingsAreParsedAndChecked).
  c.env.tool_format = "llama3";
  c.env.max_turns = 7;
  c.env.call_deadline_seconds = 0.25;
  c.env.on_failure = "drop";

  const std::string yaml = JobConfigToYaml(c);
  absl::StatusOr<JobConfig> back = ParseJobConfig(yaml, "rt.yaml");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
  ExpectSameConfig(*back, c);
  EXPECT_EQ(back->name, c.name);
  EXPECT_EQ(back->output_dir, c.output_dir);
  EXPECT_EQ(back->seed, c.seed);
  EXPECT_EQ(back->model.norm_eps, c.model.norm_eps);
  EXPECT_EQ(back->model.init_std, c.model.init_std);
  EXPECT_EQ(back->model.moe_experts, 4);
  EXPECT_EQ(back->model.moe_capacity_factor, 1.1);
  EXPECT_TRUE(back->model.moe_shared_expert);
  EXPECT_EQ(back->model.lora.rank, 8);
  EXPECT_EQ(back->model.lora.alpha, 16.5);
  EXPECT_EQ(back->model.lora.targets, "q_proj,v_proj");
  EXPECT_EQ(back->task.name, "null");
  EXPECT_EQ(back->task.reward, "true");
  EXPECT_EQ(back->rollout.temperature, c.rollout.temperature);
  EXPECT_EQ(back->optim.eps, c.optim.eps);
  EXPECT_EQ(back->optim.beta2, c.optim.beta2);
  EXPECT_FALSE(back->algorithm.norm_adv_by_std);
  EXPECT_EQ(back->algorithm.behaviour_weight_mode, BehaviourWeightMode::kMask);
  EXPECT_EQ(back->placement.mode, PlacementMode::kDisaggregated);
  EXPECT_EQ(back->placement.rollout_cards_per_super_node, 2);
  EXPECT_TRUE(back->placement.fail_if_unplaceable);
  EXPECT_EQ(back->memory.card_budget_mib, 1536.25);
  EXPECT_EQ(back->env.tool_format, "llama3");
  EXPECT_EQ(back->env.max_turns, 7);
  EXPECT_EQ(back->env.call_deadline_seconds, 0.25);
  EXPECT_EQ(back->memory.offload_optimizer, OffloadPolicy::kNever);
}

TEST(ConfigTest, LoraSectionIsReadAndChecked) {
  absl::StatusOr<JobConfig> c = ParseJobConfig(
      "model:\n  lora:\n    rank: 16\n    alpha: 32\n"
      "    targets: [q_proj, v_proj, down_proj]\n",
      "job.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(LoraEnabled(c->model));
  EXPECT_EQ(c->model.lora.targets, "q_proj,v_proj,down_proj");
  EXPECT_FALSE(LoraEnabled(JobConfig().model));
  EXPECT_EQ(*ParseLoraTargets("all-linear"),
            (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj",
                                      "gate_proj", "up_proj", "down_proj"}));
  ExpectError("model:\n  lora:\n    rank: -1\n",
              absl::StatusCode::kInvalidArgument, {"model.lora.rank", ">= 0"});
  ExpectError("model:\n  lora:\n    alpha: 8\n",
              absl::StatusCode::kInvalidArgument,
              {"model.lora.rank", "must be >= 1 when other model.lora keys"});
  ExpectError("model:\n  lora:\n    rank: 8\n    targets: [q_proj, qkv]\n",
              absl::StatusCode::kInvalidArgument,
              {"model.lora.targets", "unknown projection 'qkv'", "q_proj"});
  ExpectError("model:\n  lora:\n    rank: 8\n    targets: []\n",
              absl::StatusCode::kInvalidArgument,
              {"model.lora.targets", "names no projection"});
  ExpectError("model:\n  lora:\n    rank: 8\n    targets: [[q_proj]]\n",
              absl::StatusCode::kInvalidArgument,
              {"model.lora.targets", "expected a list of strings"});
  ExpectError(
      "model:\n  moe_experts: 4\n  lora:\n    rank: 8\n"
      "    targets: gate_proj\n",
      absl::StatusCode::kInvalidArgument,
      {"model.lora.targets", "'gate_proj' is not a layer of this model"});
  ExpectError("model:\n  lora:\n    rank: 8\n    dropout: 1\n",
              absl::StatusCode::kInvalidArgument, {"model.lora.dropout"});
  ExpectError("model:\n  lora_path: /no/such/adapter\n",
              absl::StatusCode::kNotFound, {"model.lora_path"});
}

TEST(ConfigTest, LoraPathTakesTheAdaptersSettings) {
  const std::string dir = ::testing::TempDir() + "/peft-adapter";
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir + "/adapter_config.json");
    out << R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16,
               "lora_dropout": 0.05, "bias": "none",
               "target_modules": ["v_proj", "q_proj"],
               "base_model_name_or_path": "Qwen/Qwen2.5-0.5B"})";
  }
  absl::StatusOr<JobConfig> c =
      ParseJobConfig("model:\n  lora_path: " + dir + "\n", "job.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.lora.rank, 8);
  EXPECT_EQ(c->model.lora.alpha, 16);
  EXPECT_EQ(c->model.lora.dropout, 0.05);
  EXPECT_EQ(c->model.lora.targets, "q_proj,v_proj");
  // Its resolved config.yaml reads back.
  ASSERT_TRUE(ParseJobConfig(JobConfigToYaml(*c), "config.yaml").ok());
  ExpectError(
      "model:\n  lora_path: " + dir + "\n  lora:\n    rank: 4\n",
      absl::StatusCode::kInvalidArgument,
      {"model.lora.rank", "is 4 but model.lora_path's adapter has r = 8"});
  {
    std::ofstream out(dir + "/adapter_config.json");
    out << R"({"peft_type": "PREFIX_TUNING"})";
  }
  ExpectError("model:\n  lora_path: " + dir + "\n",
              absl::StatusCode::kInvalidArgument,
              {"model.lora_path", "adapter_config.json", "peft_type"});
}

TEST(ConfigTest, ToYamlIsReadable) {
  const std::string yaml = JobConfigToYaml(JobConfig{});
  EXPECT_THAT(yaml, HasSubstr("clip_ratio_low: 0.2\n"));
  EXPECT_THAT(yaml, HasSubstr("norm_eps: 1e-05\n"));
  EXPECT_THAT(yaml, HasSubstr("temperature: 1.0\n"));
  EXPECT_THAT(yaml, HasSubstr("rope_theta: 10000.0\n"));
  EXPECT_THAT(
      yaml,
      HasSubstr("init_std: 0.02\n  moe_experts: 0\n  "
                "moe_top_k: 2\n  moe_groups: 1\n  moe_capacity_factor: 0.0\n  "
                "moe_aux_loss_coef: 0.01\n  "
                "moe_z_loss_coef: 0.001\n  "
                "moe_shared_expert: false\n  moe_d_ff: 0\n"));
  EXPECT_THAT(yaml, HasSubstr("init_checkpoint: \"\"\n"));
  EXPECT_THAT(yaml, HasSubstr("rollout:\n  prompts_per_step: 16\n"));
  EXPECT_THAT(yaml, HasSubstr("sft:\n  steps: 300\n"));
  EXPECT_THAT(yaml, HasSubstr("placement:\n  mode: colocated-sync\n  "
                              "super_nodes: 1\n  cards_per_super_node: 1\n  "
                              "rollout_cards_per_super_node: 0\n  "
                              "fused_train_threads: 0\n  "
                              "fused_rollout_threads: 0\n  "
                              "fused_share_idle_threads: true\n  "
                              "fused_turns: auto\n  "
                              "expert_parallel: 1\n  "
                              "expert_sampling: gathered\n  "
                              "fail_if_unplaceable: false\n"));
  EXPECT_THAT(yaml, HasSubstr("behaviour_weight_level: token\n  "
                              "behaviour_weight_mode: truncate\n"));
  EXPECT_THAT(yaml, HasSubstr("stalesync:\n  max_policy_lag: 0\n  "
                              "over_stale: regenerate\n  "
                              "rollout_version: lagged\n  "
                              "max_clock_skew: 0\n"));
  EXPECT_THAT(yaml, HasSubstr("memory:\n  card_budget_mib: 0.0\n  "
                              "offload_optimizer: auto\n"));
  EXPECT_THAT(yaml, Not(HasSubstr("source_path")));
  // The defaults round-trip too.
  absl::StatusOr<JobConfig> back = ParseJobConfig(yaml, "");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameConfig(*back, JobConfig{});
}

TEST(ConfigTest, MoeKeysAreCheckedWhenParsed) {
  absl::StatusOr<JobConfig> config =
      ParseJobConfig("model:\n  moe_experts: 4\n  moe_top_k: 1\n", "job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model.moe_experts, 4);
  EXPECT_EQ(config->model.moe_top_k, 1);
  EXPECT_EQ(config->model.moe_capacity_factor, 0.0);
  EXPECT_EQ(config->model.moe_aux_loss_coef, 0.01);
  EXPECT_EQ(config->model.moe_z_loss_coef, 0.001);
  EXPECT_FALSE(config->model.moe_shared_expert);
  EXPECT_EQ(config->model.moe_d_ff, 0);
  EXPECT_EQ(config->model.moe_gates, MoeGates::kAuto);
  config = ParseJobConfig(
      "model:\n  moe_experts: 4\n  moe_gates: probabilities\n", "job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model.moe_gates, MoeGates::kProbabilities);
  EXPECT_FALSE(RouterRenormalises(config->model.moe_gates, 2));
  EXPECT_TRUE(RouterRenormalises(MoeGates::kAuto, 2));
  EXPECT_FALSE(RouterRenormalises(MoeGates::kAuto, 1));
  EXPECT_TRUE(RouterRenormalises(MoeGates::kRenormalised, 1));
  ExpectError("model:\n  moe_gates: renormalised\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: model.moe_gates: applies to a mixture of experts "
               "only (model.moe_experts 0), got renormalised"});
  ExpectError("model:\n  moe_experts: 4\n  moe_gates: normalised\n",
              absl::StatusCode::kInvalidArgument, {"model.moe_gates"});
  ExpectError("model:\n  moe_expert: 4\n", absl::StatusCode::kInvalidArgument,
              {"job.yaml: model.moe_expert: unknown key (did you mean "
               "'moe_experts'?)"});
  ExpectError("model:\n  moe_experts: 16\n  moe_top_k: 9\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: model.moe_top_k: must be in [1, 8], got 9"});
  // MoGE groups and router replay.
  config = ParseJobConfig(
      "model:\n  moe_experts: 8\n  moe_top_k: 4\n  moe_groups: 2\n"
      "algorithm:\n  router_replay: true\n",
      "job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model.moe_groups, 2);
  EXPECT_TRUE(config->algorithm.router_replay);
  EXPECT_EQ(JobConfig().model.moe_groups, 1);
  EXPECT_FALSE(JobConfig().algorithm.router_replay);
  ExpectError("model:\n  moe_experts: 8\n  moe_top_k: 2\n  moe_groups: 3\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: model.moe_groups: must divide model.moe_experts (8) "
               "into equal groups, got 3"});
  ExpectError("model:\n  moe_experts: 8\n  moe_top_k: 2\n  moe_groups: 4\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: model.moe_groups: must divide model.moe_top_k (2): "
               "every token takes top_k / groups experts in each group, got "
               "4"});
  ExpectError("model:\n  moe_groups: 2\n", absl::StatusCode::kInvalidArgument,
              {"job.yaml: model.moe_groups: must be 1 for a dense model "
               "(model.moe_experts 0), got 2"});
  ExpectError("algorithm:\n  router_replay: true\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: algorithm.router_replay: needs a mixture-of-experts "
               "policy"});
  ExpectError("model:\n  moe_experts: 8\nrun:\n  export_final: true\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: run.export_final: export: a mixture-of-experts "
               "policy needs model.architecture Qwen3MoeForCausalLM or "
               "MixtralForCausalLM (LlamaForCausalLM is dense); the "
               "checkpoints hold the weights (model.pt)"});
  ExpectError(
      "model:\n  architecture: MixtralForCausalLM\n  moe_experts: 8\n"
      "  moe_groups: 2\nrun:\n  export_final: true\n",
      absl::StatusCode::kInvalidArgument,
      {"job.yaml: run.export_final: export: MixtralForCausalLM cannot "
       "express MoGE grouped routing (model.moe_groups > 1)"});
  ExpectError("model:\n  architecture: Qwen3MoeForCausalLM\n  qk_norm: true\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: model.moe_experts: must be > 0 for "
               "model.architecture Qwen3MoeForCausalLM (a mixture of "
               "experts)"});
  EXPECT_TRUE(ParseJobConfig("model:\n  architecture: MixtralForCausalLM\n"
                             "  moe_experts: 8\nrun:\n  export_final: true\n",
                             "job.yaml")
                  .ok());
  // Expert parallelism.
  config = ParseJobConfig(
      "model:\n  moe_experts: 8\n  moe_top_k: 2\n"
      "placement:\n  cards_per_super_node: 4\n  expert_parallel: 2\n",
      "job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->placement.expert_parallel, 2);
  EXPECT_EQ(JobConfig().placement.expert_parallel, 1);
  ExpectError(
      "placement:\n  cards_per_super_node: 2\n  expert_parallel: 2\n",
      absl::StatusCode::kInvalidArgument,
      {"job.yaml: placement.expert_parallel: needs a mixture-of-experts "
       "policy (model.moe_experts > 0), got 2"});
  ExpectError(
      "model:\n  moe_experts: 6\n"
      "placement:\n  cards_per_super_node: 4\n  expert_parallel: 4\n",
      absl::StatusCode::kInvalidArgument,
      {"job.yaml: placement.expert_parallel: must divide "
       "model.moe_experts (6) into equal shards, got 4"});
  ExpectError(
      "model:\n  moe_experts: 8\n"
      "placement:\n  cards_per_super_node: 3\n  expert_parallel: 2\n",
      absl::StatusCode::kInvalidArgument,
      {"job.yaml: placement.expert_parallel: must divide "
       "placement.cards_per_super_node (3)"});
  // StaleSync across super nodes: each shard's state is synced on its own.
  EXPECT_TRUE(ParseJobConfig("model:\n  moe_experts: 8\n"
                             "placement:\n  cards_per_super_node: 2\n"
                             "  super_nodes: 2\n  expert_parallel: 2\n"
                             "stalesync:\n  max_clock_skew: 1\n",
                             "job.yaml")
                  .ok());
  // Sampling from the shards, in lockstep: every card of a group must
  // sample each step from one version, in the same rounds.
  EXPECT_EQ(JobConfig().placement.expert_sampling, ExpertSampling::kGathered);
  config = ParseJobConfig(
      "model:\n  moe_experts: 8\n"
      "placement:\n  mode: fused\n  cards_per_super_node: 2\n"
      "  expert_parallel: 2\n  expert_sampling: shard\n"
      "stalesync:\n  max_policy_lag: 1\nalgorithm:\n  decoupled_loss: true\n",
      "job.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->placement.expert_sampling, ExpertSampling::kShard);
  ExpectError(
      "model:\n  moe_experts: 8\nplacement:\n  expert_sampling: shard\n",
      absl::StatusCode::kInvalidArgument,
      {"job.yaml: placement.expert_sampling: shard needs "
       "placement.expert_parallel > 1"});
  ExpectError(
      "model:\n  moe_experts: 8\n"
      "placement:\n  mode: fused\n  cards_per_super_node: 2\n"
      "  expert_parallel: 2\n  expert_sampling: shard\n"
      "stalesync:\n  max_policy_lag: 1\n  rollout_version: newest\n"
      "algorithm:\n  decoupled_loss: true\n",
      absl::StatusCode::kInvalidArgument,
      {"job.yaml: placement.expert_sampling: shard needs "
       "stalesync.rollout_version: lagged",
       "(got newest"});
  ExpectError(
      "model:\n  moe_experts: 8\n"
      "placement:\n  mode: fused\n  cards_per_super_node: 2\n"
      "  expert_parallel: 2\n  expert_sampling: shard\n"
      "stalesync:\n  max_policy_lag: 1\n  partial_rollout_tokens: 4\n"
      "algorithm:\n  decoupled_loss: true\n",
      absl::StatusCode::kInvalidArgument,
      {"job.yaml: placement.expert_sampling: shard is not built for "
       "stalesync.partial_rollout_tokens"});
  ExpectError("placement:\n  expert_sampling: all\n",
              absl::StatusCode::kInvalidArgument,
              {"placement.expert_sampling", "all"});
  ExpectError(
      "model:\n  moe_experts: 8\n"
      "placement:\n  mode: disaggregated\n  cards_per_super_node: 4\n"
      "  rollout_cards_per_super_node: 2\n  expert_parallel: 2\n",
      absl::StatusCode::kInvalidArgument,
      {"job.yaml: placement.expert_parallel: is not built for "
       "placement.mode disaggregated"});
  ExpectError("model:\n  moe_experts: 1\n  moe_top_k: 2\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: model.moe_top_k: must be <= model.moe_experts (1), "
               "got 2"});
  ExpectError("model:\n  moe_experts: 4\n  moe_capacity_factor: -1\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: model.moe_capacity_factor: must be >= 0, got -1"});
  ExpectError("model:\n  moe_shared_expert: 2\n",
              absl::StatusCode::kInvalidArgument,
              {"model.moe_shared_expert: expected true or false, got '2'"});
}

TEST(ConfigTest, ValidateChecksRanges) {
  struct Case {
    std::function<void(JobConfig&)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](JobConfig& c) { c.seed = -1; }, "seed: must be >= 0, got -1"},
      {[](JobConfig& c) { c.run.collective_timeout_seconds = 0; },
       "run.collective_timeout_seconds: must be > 0, got 0"},
      {[](JobConfig& c) { c.num_threads = 0; },
       "num_threads: must be in [1, 1024], got 0"},
      {[](JobConfig& c) { c.num_threads = 2000; },
       "num_threads: must be in [1, 1024], got 2000"},
      {[](JobConfig& c) { c.device = "gpu"; },
       "device: must be cpu, cuda, cuda:<index> or mps; got 'gpu'"},
      {[](JobConfig& c) { c.device = "cuda:"; },
       "device: must be cpu, cuda, cuda:<index> or mps; got 'cuda:'"},
      {[](JobConfig& c) { c.device = ""; }, "device: must not be empty"},
      {[](JobConfig& c) { c.name = ""; }, "name: must not be empty"},
      {[](JobConfig& c) { c.output_dir = ""; },
       "output_dir: must not be empty"},
      {[](JobConfig& c) { c.model.d_model = 4; },
       "model.d_model: must be >= 8, got 4"},
      {[](JobConfig& c) { c.model.d_model = 130; },
       "model.d_model: must be divisible by model.n_heads (4), got 130"},
      {[](JobConfig& c) { c.model.d_model = 12; },
       "model.d_model: head size model.d_model / model.n_heads must be even"},
      {[](JobConfig& c) { c.model.max_seq_len = 1; },
       "model.max_seq_len: must be >= 2, got 1"},
      {[](JobConfig& c) { c.model.norm_eps = 0; },
       "model.norm_eps: must be > 0, got 0"},
      {[](JobConfig& c) { c.model.rope_theta = -1; },
       "model.rope_theta: must be > 0, got -1"},
      {[](JobConfig& c) { c.model.moe_experts = 129; },
       "model.moe_experts: must be in [0, 128], got 129"},
      {[](JobConfig& c) { c.model.moe_experts = -1; },
       "model.moe_experts: must be in [0, 128], got -1"},
      {[](JobConfig& c) {
         c.model.moe_experts = 1;
         c.model.moe_top_k = 1;
       },
       "model.moe_experts: must be 0 (dense) or in [2, 128], got 1"},
      {[](JobConfig& c) {
         c.model.moe_experts = 1;
         c.model.moe_top_k = 2;
       },
       "model.moe_top_k: must be <= model.moe_experts (1), got 2"},
      {[](JobConfig& c) {
         c.model.moe_experts = 4;
         c.model.moe_top_k = 5;
       },
       "model.moe_top_k: must be <= model.moe_experts (4), got 5"},
      {[](JobConfig& c) { c.model.moe_top_k = 0; },
       "model.moe_top_k: must be in [1, 8], got 0"},
      {[](JobConfig& c) { c.model.moe_groups = 0; },
       "model.moe_groups: must be in [1, 128], got 0"},
      {[](JobConfig& c) { c.model.moe_capacity_factor = -0.5; },
       "model.moe_capacity_factor: must be >= 0, got -0.5"},
      {[](JobConfig& c) { c.model.moe_aux_loss_coef = -1; },
       "model.moe_aux_loss_coef: must be >= 0, got -1"},
      {[](JobConfig& c) { c.model.moe_z_loss_coef = -1; },
       "model.moe_z_loss_coef: must be >= 0, got -1"},
      {[](JobConfig& c) { c.model.moe_d_ff = -1; },
       "model.moe_d_ff: must be >= 0, got -1"},
      {[](JobConfig& c) { c.task.name = ""; }, "task.name: must not be empty"},
      {[](JobConfig& c) { c.task.eval_size = 0; },
       "task.eval_size: must be >= 1, got 0"},
      {[](JobConfig& c) { c.task.min_digits = 0; },
       "task.min_digits: must be in [1, 18], got 0"},
      {[](JobConfig& c) { c.task.max_digits = 19; },
       "task.max_digits: must be in [1, 18], got 19"},
      {[](JobConfig& c) {
         c.task.min_digits = 5;
         c.task.max_digits = 3;
       },
       "task.max_digits: must be >= task.min_digits (5), got 3"},
      {[](JobConfig& c) { c.task.num_operands = 7; },
       "task.num_operands: must be in [2, 6], got 7"},
      {[](JobConfig& c) { c.task.max_operand = 0; },
       "task.max_operand: must be in [1, 1000], got 0"},
      {[](JobConfig& c) { c.task.long_fraction = 1.5; },
       "task.long_fraction: must be in [0, 1], got 1.5"},
      {[](JobConfig& c) { c.task.long_fraction = -0.1; },
       "task.long_fraction: must be in [0, 1], got -0.1"},
      {[](JobConfig& c) { c.task.long_max = 0; },
       "task.long_max: must be in [1, 500], got 0"},
      {[](JobConfig& c) { c.task.long_max = 501; },
       "task.long_max: must be in [1, 500], got 501"},
      {[](JobConfig& c) { c.task.chat_template = "qwen"; },
       "task.chat_template: must be chatml, llama3 or none (empty = auto, "
       "from the model's tokenizer_config.json); got 'qwen'"},
      {[](JobConfig& c) { c.rollout.group_size = 0; },
       "rollout.group_size: must be >= 1, got 0"},
      {[](JobConfig& c) { c.rollout.temperature = -0.5; },
       "rollout.temperature: must be >= 0, got -0.5"},
      {[](JobConfig& c) {
         c.rollout.temperature = std::numeric_limits<double>::quiet_NaN();
       },
       "rollout.temperature: must be >= 0, got nan"},
      {[](JobConfig& c) { c.rollout.top_k = -1; },
       "rollout.top_k: must be >= 0, got -1"},
      {[](JobConfig& c) { c.rollout.top_p = 0; },
       "rollout.top_p: must be in (0, 1], got 0"},
      {[](JobConfig& c) {
         c.algorithm.adv_estimator = AdvEstimator::kRloo;
         c.rollout.group_size = 1;
       },
       "rollout.group_size: must be >= 2 when algorithm.adv_estimator is "
       "rloo, got 1"},
      {[](JobConfig& c) {
         c.algorithm.adv_estimator = static_cast<AdvEstimator>(7);
       },
       "algorithm.adv_estimator: not a valid value (7)"},
      {[](JobConfig& c) { c.algorithm.gamma = 1.5; },
       "algorithm.gamma: must be in [0, 1], got 1.5"},
      {[](JobConfig& c) { c.algorithm.clip_ratio_low = 1; },
       "algorithm.clip_ratio_low: must be in [0, 1), got 1"},
      {[](JobConfig& c) { c.algorithm.clip_ratio_c = -1; },
       "algorithm.clip_ratio_c: must be >= 0, got -1"},
      {[](JobConfig& c) {
         c.algorithm.loss_agg_mode = static_cast<LossAggMode>(7);
       },
       "algorithm.loss_agg_mode: not a valid value (7)"},
      {[](JobConfig& c) { c.algorithm.kl_coef = -0.1; },
       "algorithm.kl_coef: must be >= 0, got -0.1"},
      {[](JobConfig& c) {
         c.algorithm.kl_estimator = static_cast<KlEstimator>(7);
       },
       "algorithm.kl_estimator: not a valid value (7)"},
      {[](JobConfig& c) { c.algorithm.kl_mode = static_cast<KlMode>(7); },
       "algorithm.kl_mode: not a valid value (7)"},
      {[](JobConfig& c) { c.algorithm.ppo_epochs = 0; },
       "algorithm.ppo_epochs: must be >= 1, got 0"},
      {[](JobConfig& c) { c.optim.lr = 0; }, "optim.lr: must be > 0, got 0"},
      {[](JobConfig& c) { c.optim.beta2 = 1; },
       "optim.beta2: must be in [0, 1), got 1"},
      {[](JobConfig& c) { c.optim.eps = 0; }, "optim.eps: must be > 0, got 0"},
      {[](JobConfig& c) { c.optim.grad_clip = -1; },
       "optim.grad_clip: must be >= 0, got -1"},
      {[](JobConfig& c) { c.optim.micro_batch_size = 0; },
       "optim.micro_batch_size: must be >= 1, got 0"},
      {[](JobConfig& c) { c.run.total_steps = 0; },
       "run.total_steps: must be >= 1, got 0"},
      {[](JobConfig& c) { c.run.log_every = 0; },
       "run.log_every: must be >= 1, got 0"},
      {[](JobConfig& c) { c.sft.batch_size = 0; },
       "sft.batch_size: must be >= 1, got 0"},
      {[](JobConfig& c) { c.sft.lr = 0; }, "sft.lr: must be > 0, got 0"},
      {[](JobConfig& c) { c.sft.warmup_steps = -1; },
       "sft.warmup_steps: must be >= 0, got -1"},
      {[](JobConfig& c) { c.sft.steps = -1; },
       "sft.steps: must be >= 0, got -1"},
      {[](JobConfig& c) { c.rollout.max_new_tokens = 80; },
       "rollout.max_new_tokens: must be < model.max_seq_len (64), got 80"},
      {[](JobConfig& c) { c.rollout.max_new_tokens = 64; },
       "rollout.max_new_tokens: must be < model.max_seq_len (64), got 64"},
      {[](JobConfig& c) { c.placement.mode = static_cast<PlacementMode>(7); },
       "placement.mode: not a valid value (7)"},
      {[](JobConfig& c) {
         c.stalesync.over_stale = static_cast<OverStalePolicy>(7);
       },
       "stalesync.over_stale: not a valid value (7)"},
      {[](JobConfig& c) { c.placement.super_nodes = 0; },
       "placement.super_nodes: must be in [1, 4096], got 0"},
      {[](JobConfig& c) { c.placement.super_nodes = 4097; },
       "placement.super_nodes: must be in [1, 4096], got 4097"},
      {[](JobConfig& c) { c.placement.cards_per_super_node = 0; },
       "placement.cards_per_super_node: must be in [1, 4096], got 0"},
      {[](JobConfig& c) { c.placement.cards_per_super_node = 4097; },
       "placement.cards_per_super_node: must be in [1, 4096], got 4097"},
      {[](JobConfig& c) { c.placement.rollout_cards_per_super_node = -1; },
       "placement.rollout_cards_per_super_node: must be >= 0, got -1"},
      {[](JobConfig& c) {
         c.placement.mode = PlacementMode::kDisaggregated;
         c.placement.cards_per_super_node = 4;
       },
       "placement.rollout_cards_per_super_node: disaggregated needs "
       "1..cards_per_super_node-1 rollout cards, got 0"},
      {[](JobConfig& c) {
         c.placement.mode = PlacementMode::kDisaggregated;
         c.placement.cards_per_super_node = 4;
         c.placement.rollout_cards_per_super_node = 4;
       },
       "placement.rollout_cards_per_super_node: disaggregated needs "
       "1..cards_per_super_node-1 rollout cards, got 4"},
      {[](JobConfig& c) {
         c.placement.mode = PlacementMode::kDisaggregated;
         c.placement.rollout_cards_per_super_node = 1;
       },
       "placement.cards_per_super_node: must be >= 2 when placement.mode is "
       "disaggregated (at least one rollout and one train card), got 1"},
      {[](JobConfig& c) {
         c.placement.mode = PlacementMode::kFused;
         c.placement.cards_per_super_node = 4;
         c.placement.rollout_cards_per_super_node = 2;
       },
       "placement.rollout_cards_per_super_node: must be 0 unless "
       "placement.mode is disaggregated, got 2"},
      {[](JobConfig& c) { c.placement.rollout_cards_per_super_node = 1; },
       "placement.rollout_cards_per_super_node: must be 0 unless "
       "placement.mode is disaggregated, got 1"},
      {[](JobConfig& c) { c.memory.card_budget_mib = -0.5; },
       "memory.card_budget_mib: must be in [0, 1099511627776], got -0.5"},
      {[](JobConfig& c) { c.memory.card_budget_mib = 2e12; },
       "memory.card_budget_mib: must be in [0, 1099511627776], got 2e+12"},
      {[](JobConfig& c) {
         c.memory.card_budget_mib = std::numeric_limits<double>::quiet_NaN();
       },
       "memory.card_budget_mib: must be in [0, 1099511627776], got nan"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    JobConfig config;
    c.mutate(config);
    absl::Status status = ValidateJobConfig(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), StartsWith(c.message));
    // With a source, messages are prefixed by it.
    config.source_path = "job.yaml";
    status = ValidateJobConfig(config);
    EXPECT_THAT(std::string(status.message()),
                StartsWith("job.yaml: " + c.message));
  }
}

TEST(ConfigTest, ValidateAcceptsEdgeValues) {
  JobConfig c;
  c.device = "cuda:12";
  c.algorithm.adv_estimator = AdvEstimator::kRloo;
  c.rollout.group_size = 2;
  c.algorithm.clip_ratio_c = 0.5;  // <= 1: dual clip off
  c.rollout.temperature = 0;
  c.rollout.top_p = 1;
  c.rollout.max_new_tokens = 63;
  c.task.min_digits = 18;
  c.task.max_digits = 18;
  c.task.name = "my_registered_task";
  c.optim.beta1 = 0;
  c.model.d_model = 8;
  c.model.n_heads = 4;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.model.moe_experts = 2;  // top_k 2 of 2 experts, dropless
  c.model.moe_capacity_factor = 0;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.model.moe_experts = 64;
  c.model.moe_top_k = 1;
  c.model.moe_capacity_factor = 0.01;
  c.model.moe_aux_loss_coef = 0;
  c.model.moe_z_loss_coef = 0;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.device = "mps";
  EXPECT_TRUE(ValidateJobConfig(c).ok());
  c.placement.mode = PlacementMode::kDisaggregated;
  c.placement.super_nodes = 4096;
  c.placement.cards_per_super_node = 2;
  c.placement.rollout_cards_per_super_node = 1;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.placement.cards_per_super_node = 4096;
  c.placement.rollout_cards_per_super_node = 4095;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.placement.mode = PlacementMode::kFused;
  c.placement.rollout_cards_per_super_node = 0;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.memory.card_budget_mib = 1099511627776.0;
  c.memory.offload_optimizer = OffloadPolicy::kNever;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
}

// A Hugging Face model directory holding only `config_json`.
std::string HfDir(const std::string& name, const std::string& config_json) {
  const std::string dir =
      absl::StrCat(testing::TempDir(), "/fusionrl_config_test_hf_", name);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config_json;
  return dir;
}

constexpr char kQwen3Json[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "hidden_size": 64,
  "intermediate_size": 128, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
  "vocab_size": 1000, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
  "tie_word_embeddings": true, "hidden_act": "silu",
  "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 64}})";

TEST(ConfigTest, HfPathTakesTheArchitectureFromConfigJson) {
  const std::string dir = HfDir("qwen3", kQwen3Json);
  auto c =
      ParseJobConfig(absl::StrCat("model: {hf_path: ", dir, "}"), "j.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c->model.d_model, 64);
  EXPECT_EQ(c->model.n_kv_heads, 2);
  EXPECT_EQ(c->model.head_dim, 32);
  EXPECT_EQ(c->model.vocab_size, 1000);
  EXPECT_TRUE(c->model.qk_norm);
  EXPECT_FALSE(c->model.qkv_bias);
  EXPECT_TRUE(c->model.tie_embeddings);
  EXPECT_EQ(c->model.rope_scaling.type, "llama3");
  EXPECT_EQ(c->model.rope_scaling.original_max_position_embeddings, 64);
  // The resolved config reads back (its architecture keys equal the import).
  auto again = ParseJobConfig(JobConfigToYaml(*c), "j.yaml");
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectSameConfig(*c, *again);
}

// A config built in code gets what a file's keys get: the architecture of
// model.hf_path and the checks, once (Job::Start hands the manager the
// result as it is).
TEST(ConfigTest, ResolveJobConfigImportsTheArchitectureAndValidates) {
  JobConfig c;
  c.source_path = "built";
  c.model.hf_path = HfDir("qwen3-resolve", kQwen3Json);
  ASSERT_TRUE(ResolveJobConfig(c).ok());
  EXPECT_EQ(c.model.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c.model.d_model, 64);
  EXPECT_EQ(c.model.n_kv_heads, 2);
  auto parsed = ParseJobConfig(
      absl::StrCat("model: {hf_path: ", c.model.hf_path, "}"), "built");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ExpectSameConfig(c, *parsed);
  EXPECT_TRUE(ResolveJobConfig(c).ok());  // a second time changes nothing
  ExpectSameConfig(c, *parsed);
  c.model.n_layers = 12;
  EXPECT_EQ(ResolveJobConfig(c).message(),
            "built: model.n_layers: is 12 but model.hf_path's config.json "
            "gives 2; leave the architecture keys unset with model.hf_path");
  JobConfig bad;
  bad.rollout.group_size = 0;
  EXPECT_THAT(std::string(ResolveJobConfig(bad).message()),
              HasSubstr("rollout.group_size"));
}

TEST(ConfigTest, HfPathRefusesConflictingArchitectureKeys) {
  const std::string dir = HfDir("qwen3b", kQwen3Json);
  auto c = ParseJobConfig(
      absl::StrCat("model: {hf_path: ", dir, ", n_layers: 12}"), "j.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "j.yaml: model.n_layers: is 12 but model.hf_path's config.json "
            "gives 2; leave the architecture keys unset with model.hf_path");
  // An override is named instead of the file. (A key set to its default
  // value counts as unset: it takes the imported value.)
  c = ParseJobConfig(absl::StrCat("model: {hf_path: ", dir, "}"), "j.yaml",
                     {"model.n_kv_heads=4"});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              StartsWith("--set model.n_kv_heads=4: is 4 but model.hf_path's "
                         "config.json gives 2"));
  const std::string bad =
      HfDir("gpt2", R"({"architectures": ["GPT2LMHeadModel"]})");
  c = ParseJobConfig(absl::StrCat("model: {hf_path: ", bad, "}"), "j.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("model.hf_path: " + bad +
                        "/config.json: architectures: 'GPT2LMHeadModel' is "
                        "not supported"));
}

TEST(ConfigTest, ArchitectureKeysAreChecked) {
  auto c = ParseJobConfig("model: {architecture: Qwen2ForCausalLM}", "j.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "j.yaml: model.qkv_bias: must be true for model.architecture "
            "Qwen2ForCausalLM");
  c = ParseJobConfig("model: {n_heads: 4, n_kv_heads: 3}", "j.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("model.n_kv_heads"));
  c = ParseJobConfig("model: {head_dim: 7}", "j.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("model.head_dim: must be even"));
  c = ParseJobConfig("model: {rope_scaling: {type: yarn}}", "j.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("model.rope_scaling.type"));
  c = ParseJobConfig(
      "model: {architecture: Qwen3ForCausalLM, qk_norm: true, head_dim: 48, "
      "d_model: 128, n_heads: 4, n_kv_heads: 2, tie_embeddings: true}\n"
      "optim: {logits_chunk_tokens: 0}\nrun: {export_final: true}",
      "j.yaml");
  EXPECT_TRUE(c.ok()) << c.status();
}

}  // namespace
}  // namespace fusionrl
