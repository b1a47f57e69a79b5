// config.json as transformers v4 and v5 write it: rope settings in either
// form (and both, when they agree), each architecture's own head_dim
// default, the mixtures of experts (Qwen3-MoE, Mixtral), and what is
// refused by name.
#include "core/hf_config.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// A small Qwen3-shaped config.json (hidden 64, 4 heads) with `extra` merged
// in (a null value removes the key).
Json Qwen3(const Json& extra = Json::object()) {
  Json j = {{"architectures", {"Qwen3ForCausalLM"}},
            {"model_type", "qwen3"},
            {"vocab_size", 256},
            {"hidden_size", 64},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"head_dim", 32},
            {"intermediate_size", 128},
            {"rope_theta", 1000000.0},
            {"rms_norm_eps", 1e-6},
            {"tie_word_embeddings", true}};
  j.merge_patch(extra);
  return j;
}

absl::StatusOr<HfModelInfo> Read(const Json& config, const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/hf-config-" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config.dump(2);
  return ReadHfModelConfig(dir);
}

TEST(HfConfigTest, V5RopeParametersGiveThetaAndScaling) {
  // transformers v5: rope_theta lives in rope_parameters only.
  auto plain =
      Read(Qwen3({{"rope_theta", nullptr},
                  {"rope_parameters",
                   {{"rope_type", "default"}, {"rope_theta", 1000000.0}}}}),
           "v5-default");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->model.rope_theta, 1000000.0);
  EXPECT_EQ(plain->model.rope_scaling.type, "none");

  auto llama3 = Read(Qwen3({{"rope_theta", nullptr},
                            {"rope_parameters",
                             {{"rope_type", "llama3"},
                              {"rope_theta", 500000.0},
                              {"factor", 8.0},
                              {"low_freq_factor", 1.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 8192}}}}),
                     "v5-llama3");
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  EXPECT_EQ(llama3->model.rope_theta, 500000.0);
  EXPECT_EQ(llama3->model.rope_scaling.type, "llama3");
  EXPECT_EQ(llama3->model.rope_scaling.factor, 8.0);
  EXPECT_EQ(llama3->model.rope_scaling.original_max_position_embeddings, 8192);
}

TEST(HfConfigTest, BothFormsMustAgree) {
  auto same = Read(
      Qwen3({{"rope_parameters",
              {{"rope_type", "linear"},
               {"rope_theta", 1000000.0},
               {"factor", 2.0}}},
             {"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}}}),
      "both-same");
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->model.rope_scaling.type, "linear");
  EXPECT_EQ(same->model.rope_scaling.factor, 2.0);

  auto theta = Read(Qwen3({{"rope_parameters",
                            {{"rope_type", "default"}, {"rope_theta", 1e4}}}}),
                    "both-theta");
  ASSERT_FALSE(theta.ok());
  EXPECT_THAT(theta.status().message(),
              HasSubstr("rope_theta: 1e+06 differs from "
                        "rope_parameters.rope_theta (10000)"));

  auto scaling = Read(
      Qwen3({{"rope_parameters",
              {{"rope_type", "linear"},
               {"rope_theta", 1000000.0},
               {"factor", 2.0}}},
             {"rope_scaling", {{"rope_type", "linear"}, {"factor", 4.0}}}}),
      "both-scaling");
  ASSERT_FALSE(scaling.ok());
  EXPECT_THAT(scaling.status().message(),
              HasSubstr("rope_scaling: differs from rope_parameters"));
}

TEST(HfConfigTest, UnsupportedRopeIsRefusedWhereverItIsWritten) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    for (const char* type : {"yarn", "dynamic", "longrope"}) {
      auto r = Read(Qwen3({{key,
                            {{"rope_type", type},
                             {"rope_theta", 1000000.0},
                             {"factor", 4.0}}}}),
                    std::string(key) + "-" + type);
      ASSERT_FALSE(r.ok()) << key << " " << type;
      EXPECT_THAT(r.status().message(),
                  HasSubstr(std::string(key) + ": rope type '" + type +
                            "' is not supported"));
    }
  }
  auto per_layer =
      Read(Qwen3({{"rope_parameters",
                   {{"full_attention",
                     {{"rope_type", "default"}, {"rope_theta", 1000000.0}}},
                    {"sliding_attention",
                     {{"rope_type", "default"}, {"rope_theta", 10000.0}}}}}}),
           "per-layer");
  ASSERT_FALSE(per_layer.ok());
  EXPECT_THAT(per_layer.status().message(),
              HasSubstr("rope_parameters: rope parameters per layer type"));
}

TEST(HfConfigTest, HeadDimDefaultsAreEachArchitecturesOwn) {
  // Qwen3Config's head_dim default is 128, whatever hidden / heads is.
  auto qwen3 = Read(Qwen3({{"head_dim", nullptr}}), "qwen3-head-dim");
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  EXPECT_EQ(qwen3->model.head_dim, 128);
  auto llama = Read(Qwen3({{"architectures", {"LlamaForCausalLM"}},
                           {"model_type", "llama"},
                           {"head_dim", nullptr}}),
                    "llama-head-dim");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->model.head_dim, 16);  // 64 / 4
  auto given = Read(Qwen3(), "qwen3-given");
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->model.head_dim, 32);
}

// Qwen3-30B-A3B's MoE keys on the small Qwen3 shape.
Json Qwen3Moe(const Json& extra = Json::object()) {
  Json j = Qwen3({{"architectures", {"Qwen3MoeForCausalLM"}},
                  {"model_type", "qwen3_moe"},
                  {"num_experts", 128},
                  {"num_experts_per_tok", 8},
                  {"moe_intermediate_size", 48},
                  {"norm_topk_prob", true},
                  {"decoder_sparse_step", 1},
                  {"mlp_only_layers", Json::array()}});
  j.merge_patch(extra);
  return j;
}

TEST(HfConfigTest, MixturesOfExpertsReadTheirExpertsAndRoundTrip) {
  auto qwen = Read(Qwen3Moe(), "qwen3-moe");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->model.moe_experts, 128);
  EXPECT_EQ(qwen->model.moe_top_k, 8);
  EXPECT_EQ(qwen->model.moe_d_ff, 48);
  EXPECT_EQ(qwen->model.d_ff, 128);
  EXPECT_TRUE(qwen->model.qk_norm);
  // norm_topk_prob true with k = 8 is auto's rule for that k.
  EXPECT_EQ(qwen->model.moe_gates, MoeGates::kAuto);
  // Mixtral: intermediate_size is each expert's width; no head_dim key
  // means hidden / heads.
  auto mixtral = Read(Qwen3({{"architectures", {"MixtralForCausalLM"}},
                             {"model_type", "mixtral"},
                             {"head_dim", nullptr},
                             {"num_local_experts", 8},
                             {"num_experts_per_tok", 2},
                             {"sliding_window", nullptr}}),
                      "mixtral");
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_EQ(mixtral->model.moe_experts, 8);
  EXPECT_EQ(mixtral->model.moe_top_k, 2);
  EXPECT_EQ(mixtral->model.moe_d_ff, 0);
  EXPECT_EQ(mixtral->model.head_dim, 16);
  EXPECT_EQ(mixtral->model.moe_gates, MoeGates::kAuto);
  auto no_theta = Read(Qwen3({{"architectures", {"MixtralForCausalLM"}},
                              {"rope_theta", nullptr}}),
                       "mixtral-theta");
  ASSERT_TRUE(no_theta.ok()) << no_theta.status();
  EXPECT_EQ(no_theta->model.rope_theta, 1e6);  // MixtralConfig's default
  EXPECT_FALSE(mixtral->model.qk_norm);
  // Both write back what they read.
  for (const HfModelInfo* info : {&*qwen, &*mixtral}) {
    auto text = HfConfigJson(info->model, info->model.vocab_size, 1, {2},
                             "bfloat16", 512);
    ASSERT_TRUE(text.ok()) << text.status();
    auto again = Read(Json::parse(*text), "again-" + info->model.architecture);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(SameArchitecture(again->model, info->model))
        << info->model.architecture;
  }
}

// norm_topk_prob and k name model.moe_gates: auto where they agree with
// auto's rule (renormalised for k >= 2, the probability for k = 1), else
// the rule by name; Mixtral always renormalises. Each writes back what it
// read, and a job that pins another rule than the directory's is refused.
TEST(HfConfigTest, RouterGateRulesAreReadAndWrittenBack) {
  struct Case {
    Json config;
    MoeGates gates;
    bool renormalised;
  };
  const Json mixtral_top1 = Qwen3({{"architectures", {"MixtralForCausalLM"}},
                                   {"model_type", "mixtral"},
                                   {"num_local_experts", 4},
                                   {"num_experts_per_tok", 1}});
  const Case cases[] = {
      {Qwen3Moe({{"norm_topk_prob", false}}), MoeGates::kProbabilities, false},
      {Qwen3Moe({{"norm_topk_prob", nullptr}}), MoeGates::kProbabilities,
       false},  // Qwen3MoeConfig's default: false
      {Qwen3Moe({{"num_experts_per_tok", 1}}), MoeGates::kRenormalised, true},
      {Qwen3Moe({{"num_experts_per_tok", 1}, {"norm_topk_prob", false}}),
       MoeGates::kAuto, false},
      {mixtral_top1, MoeGates::kRenormalised, true},
  };
  for (const Case& c : cases) {
    auto info = Read(c.config, "gates");
    ASSERT_TRUE(info.ok()) << info.status() << c.config.dump();
    EXPECT_EQ(info->model.moe_gates, c.gates) << c.config.dump();
    EXPECT_EQ(RouterRenormalises(info->model.moe_gates, info->model.moe_top_k),
              c.renormalised);
    EXPECT_TRUE(HfExportable(info->model).ok()) << c.config.dump();
    auto text =
        HfConfigJson(info->model, info->model.vocab_size, 1, {2}, "float32");
    ASSERT_TRUE(text.ok()) << text.status();
    auto again = Read(Json::parse(*text), "gates-again");
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->model.moe_gates, c.gates) << *text;
    EXPECT_TRUE(SameArchitecture(again->model, info->model));
  }
  ModelConfig a;
  a.moe_experts = 4;
  a.moe_top_k = 2;
  ModelConfig b = a;
  b.moe_gates = MoeGates::kRenormalised;
  EXPECT_TRUE(SameArchitecture(a, b));  // the same rule for k = 2
  b.moe_gates = MoeGates::kProbabilities;
  EXPECT_FALSE(SameArchitecture(a, b));
}

TEST(HfConfigTest, MoeFeaturesFusionRlCannotComputeAreRefusedByName) {
  struct Case {
    Json config;
    std::string key;
    std::string why;
  };
  const Case cases[] = {
      {Qwen3Moe({{"decoder_sparse_step", 2}}), "decoder_sparse_step",
       "dense layers between them are not supported"},
      {Qwen3Moe({{"mlp_only_layers", {1}}}), "mlp_only_layers",
       "must be empty"},
      {Qwen3Moe({{"num_experts", 256}}), "num_experts", "must be in [2, 128]"},
      {Qwen3Moe({{"num_experts_per_tok", 16}}), "num_experts_per_tok",
       "must be in [1, 8]"},
      {Qwen3({{"architectures", {"MixtralForCausalLM"}},
              {"num_local_experts", 8},
              {"router_jitter_noise", 0.01}}),
       "router_jitter_noise", "training noise"},
      {Qwen3({{"architectures", {"MixtralForCausalLM"}},
              {"num_local_experts", 8},
              {"sliding_window", 4096}}),
       "sliding_window", "sliding-window attention is not supported"},
  };
  int i = 0;
  for (const Case& c : cases) {
    auto info = Read(c.config, "moe-bad-" + std::to_string(i++));
    ASSERT_FALSE(info.ok()) << c.key;
    EXPECT_THAT(std::string(info.status().message()),
                HasSubstr("config.json: " + c.key + ": "))
        << info.status();
    EXPECT_THAT(std::string(info.status().message()), HasSubstr(c.why))
        << info.status();
  }
}

TEST(HfConfigTest, ExportRefusesWhatTheArchitectureCannotExpress) {
  auto qwen = Read(Qwen3Moe(), "qwen3-moe-export");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_TRUE(HfExportable(qwen->model).ok());
  auto refused = [](ModelConfig m) {
    return std::string(HfExportable(m).message());
  };
  ModelConfig m = qwen->model;
  m.moe_groups = 2;
  EXPECT_THAT(refused(m), HasSubstr("cannot express MoGE grouped routing"));
  m = qwen->model;
  m.moe_shared_expert = true;
  EXPECT_THAT(refused(m), HasSubstr("a shared expert"));
  m = qwen->model;
  m.architecture = "Qwen3ForCausalLM";
  EXPECT_THAT(refused(m),
              HasSubstr("needs model.architecture Qwen3MoeForCausalLM or "
                        "MixtralForCausalLM (Qwen3ForCausalLM is dense)"));
  m = qwen->model;
  m.moe_experts = 0;
  EXPECT_THAT(refused(m), HasSubstr("is a mixture of experts"));
  // Top-1 with the probability as its gate: Qwen3-MoE writes it
  // (norm_topk_prob false), Mixtral cannot; nor unnormalised top-2.
  m = qwen->model;
  m.moe_top_k = 1;
  EXPECT_TRUE(HfExportable(m).ok());
  auto text = HfConfigJson(m, m.vocab_size, 1, {2}, "float32");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Json::parse(*text).at("norm_topk_prob"), false);
  m.architecture = "MixtralForCausalLM";
  m.qk_norm = false;
  m.moe_d_ff = 0;
  EXPECT_THAT(refused(m), HasSubstr("gates that are the router's "
                                    "probabilities themselves"));
  m.moe_gates = MoeGates::kRenormalised;
  EXPECT_TRUE(HfExportable(m).ok());
  m.moe_top_k = 2;
  m.moe_gates = MoeGates::kProbabilities;
  EXPECT_THAT(refused(m), HasSubstr("gates that are the router's "
                                    "probabilities themselves"));
  m.moe_gates = MoeGates::kAuto;
  m.moe_d_ff = 48;
  EXPECT_THAT(refused(m), HasSubstr("experts narrower than model.d_ff"));
}

}  // namespace
}  // namespace fusionrl

namespace fusionrl {
namespace {

// adapter_config.json as PEFT 0.13 writes it for a LoRA adapter of
// q_proj and v_proj, r 8, alpha 16, with `extra` merged in.
absl::StatusOr<PeftAdapterInfo> ReadAdapter(const nlohmann::json& extra,
                                            const std::string& name) {
  nlohmann::json j = {{"peft_type", "LORA"},
                      {"task_type", "CAUSAL_LM"},
                      {"r", 8},
                      {"lora_alpha", 16},
                      {"lora_dropout", 0.0},
                      {"target_modules", {"q_proj", "v_proj"}},
                      {"bias", "none"},
                      {"fan_in_fan_out", false},
                      {"use_rslora", false},
                      {"use_dora", false},
                      {"modules_to_save", nullptr},
                      {"layers_to_transform", nullptr},
                      {"layers_pattern", nullptr},
                      {"rank_pattern", nlohmann::json::object()},
                      {"alpha_pattern", nlohmann::json::object()},
                      {"base_model_name_or_path", "Qwen/Qwen2.5-0.5B"}};
  j.merge_patch(extra);
  const std::string dir = ::testing::TempDir() + "/peft-" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/adapter_config.json") << j.dump(2);
  return ReadPeftAdapterConfig(dir);
}

// PEFT scales a module matching an alpha_pattern key by that alpha / r
// (and a rank_pattern key gives it another r): FusionRL applies one r and
// one lora_alpha to every adapter, so it refuses such an adapter by the
// key's name rather than train or generate with the wrong scale.
TEST(HfConfigTest, PeftPerModulePatternsAreRefusedByName) {
  auto plain = ReadAdapter(nlohmann::json::object(), "plain");
  ASSERT_TRUE(plain.ok()) << plain.status();  // empty maps: PEFT's default
  EXPECT_EQ(plain->lora.rank, 8);
  EXPECT_EQ(plain->lora.alpha, 16);
  for (const char* key : {"alpha_pattern", "rank_pattern"}) {
    const nlohmann::json value =
        key[0] == 'a' ? nlohmann::json({{"q_proj", 32}})
                      : nlohmann::json({{"model.layers.0.self_attn.v_proj", 4}});
    auto read = ReadAdapter({{key, value}}, key);
    ASSERT_FALSE(read.ok()) << key << " was accepted and ignored";
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(read.status().message()),
                HasSubstr(absl::StrCat("adapter_config.json: '", key, "'")));
    EXPECT_THAT(std::string(read.status().message()),
                HasSubstr("not supported"));
  }
  // Absent (older PEFT versions; merge_patch drops a null): the default.
  EXPECT_TRUE(
      ReadAdapter({{"alpha_pattern", nullptr}, {"rank_pattern", nullptr}},
                  "absent")
          .ok());
  EXPECT_FALSE(ReadAdapter({{"alpha_pattern", "q_proj"}}, "string").ok());
}

}  // namespace
}  // namespace fusionrl
