// config.json as transformers v4 and v5 write it: rope settings in either
// form (and both, when they agree), each architecture's own head_dim
// default, and what is refused by name.
#include "core/hf_config.h"

#include <filesystem>
#include <fstream>
#include <string>

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

}  // namespace
}  // namespace fusionrl
