// ConfigTest: the model's sections (LoRA, mixture of experts) and the
// architecture taken from a Hugging Face directory.
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
