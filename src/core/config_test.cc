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
#include "core/config_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

using config_testing::ExpectError;
using config_testing::ExpectSameConfig;
using config_testing::MissingPath;
using config_testing::WriteTempFile;

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

}  // namespace
}  // namespace fusionrl
