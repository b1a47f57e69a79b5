// ConfigTest: YAML errors, the files and task keys a job names, overrides,
// and the round trip through YAML.
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
#include "fusionrl/config.h"
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

}  // namespace
}  // namespace fusionrl
