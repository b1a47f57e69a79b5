// LoRA (engine/model/lora.h, PolicyModel's LoRA members,
// engine/model/hf_model.h's PEFT adapters): merged and unmerged forwards agree,
// a step changes only the adapters, PEFT export/import round-trips, the merged
// export is base + (alpha / r) B A, and bad adapters are refused by name.
#include "engine/model/lora.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/hf_model.h"
#include "engine/model/model.h"
#include "engine/model/test_util.h"
#include "engine/train/activation_memory.h"
#include "engine/train/memory_accounting.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"
#include "hf/safetensors.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace {

const c10::Device kCpu("cpu");
constexpr int kVocab = 98;

ModelConfig LoraConfigOf(int rank, const std::string& targets) {
  ModelConfig c = testing_util::TinyModelConfig();
  c.architecture = "Qwen2ForCausalLM";
  c.qkv_bias = true;  // LoRA beside a bias
  c.lora.rank = rank;
  c.lora.alpha = 2.0 * rank;
  c.lora.targets = targets;
  return c;
}

std::unique_ptr<PolicyModel> Make(const ModelConfig& c, uint64_t seed = 5) {
  return PolicyModel::Create(c, kVocab, kCpu, seed).value();
}

// The same architecture without LoRA.
ModelConfig Plain(ModelConfig c) {
  c.lora = LoraConfig();
  return c;
}

// Gives every B a random value (B starts at zero, which hides the update).
void RandomizeB(PolicyModel& m, uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& [name, t] : m.named_trainable_parameters()) {
    if (name.size() > 6 && name.substr(name.size() - 6) == "lora_B") {
      t.copy_(at::normal(0.0, 0.1, t.sizes(), gen));
    }
  }
}

struct Batch {
  at::Tensor tokens, positions, valid;
};

Batch MakeBatch() {
  auto tokens = torch::randint(3, kVocab, {3, 9},
                               at::make_generator<at::CPUGeneratorImpl>(11));
  auto valid = torch::ones({3, 9}, torch::kBool);
  valid.index_put_({1, torch::indexing::Slice(0, 3)}, false);  // left pad
  return {tokens, PositionsFromValid(valid), valid};
}

at::Tensor Logits(PolicyModel& m, const Batch& b) {
  torch::NoGradGuard no_grad;
  return m.Forward(b.tokens, b.positions, b.valid);
}

// W + (alpha / r) B A by hand, for a named projection.
at::Tensor ByHand(PolicyModel& m, const std::string& proj) {
  std::map<std::string, at::Tensor> base, adapters;
  for (auto& [n, t] : m.named_parameters()) base[n] = t.detach();
  for (auto& [n, t] : m.named_trainable_parameters()) adapters[n] = t.detach();
  const double scale = m.config().lora.alpha / m.config().lora.rank;
  return base.at(proj + ".weight") +
         scale *
             adapters.at(proj + ".lora_B").mm(adapters.at(proj + ".lora_A"));
}

TEST(LoraTest, AdaptersStartAsTheBaseModelAndOnlyTheyTrain) {
  auto lora = Make(LoraConfigOf(4, "all-linear"));
  auto base = Make(Plain(lora->config()));
  const Batch b = MakeBatch();
  // Same seed, same base weights; B = 0 adds nothing.
  EXPECT_TRUE(torch::equal(Logits(*base, b), Logits(*lora, b)));
  for (const at::Tensor& p : lora->parameters()) {
    EXPECT_FALSE(p.requires_grad());
  }
  // 2 layers x 7 projections x (A, B).
  const auto trainable = lora->named_trainable_parameters();
  ASSERT_EQ(trainable.size(), 28u);
  EXPECT_EQ(trainable[0].first, "block0.attn.wq.lora_A");
  EXPECT_EQ(trainable[0].second.sizes(), (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(trainable[1].second.sizes(), (std::vector<int64_t>{32, 4}));
  EXPECT_GT(trainable[0].second.abs().sum().item<double>(), 0);
  EXPECT_EQ(trainable[1].second.abs().sum().item<double>(), 0);
  for (const at::Tensor& p : lora->trainable_parameters()) {
    EXPECT_TRUE(p.requires_grad());
    EXPECT_EQ(p.scalar_type(), torch::kFloat);
  }
}

TEST(LoraTest, MergedAndUnmergedForwardsAgree) {
  for (const char* targets : {"all-linear", "q_proj,v_proj", "down_proj"}) {
    auto lora = Make(LoraConfigOf(4, targets));
    RandomizeB(*lora, 3);
    const Batch b = MakeBatch();
    const at::Tensor unmerged = Logits(*lora, b);
    auto merged = lora->CloneFrozen();
    EXPECT_TRUE(merged->lora_merged());
    const at::Tensor m = Logits(*merged, b);
    EXPECT_TRUE(torch::allclose(unmerged, m, 1e-4, 1e-5))
        << targets << " max diff " << (unmerged - m).abs().max().item<double>();
    // The adapters changed the function.
    auto base = Make(Plain(lora->config()));
    EXPECT_GT((Logits(*base, b) - unmerged).abs().max().item<double>(), 1e-3);
    // The merged weights are W + (alpha / r) B A.
    std::map<std::string, at::Tensor> mw;
    for (auto& [n, t] : merged->named_parameters()) mw[n] = t;
    for (const std::string proj : {"block1.attn.wv", "block0.mlp.w2"}) {
      if (std::string(targets).find(proj == "block1.attn.wv"
                                        ? "v_proj"
                                        : "down_proj") == std::string::npos &&
          std::string(targets) != "all-linear") {
        continue;
      }
      const at::Tensor want = ByHand(*lora, proj);
      EXPECT_TRUE(torch::allclose(mw.at(proj + ".weight"), want, 1e-6, 1e-6))
          << proj;
    }
    // New adapters reach the view through LoadTrainable (a weight sync).
    RandomizeB(*lora, 4);
    merged->LoadTrainable(lora->trainable_parameters());
    EXPECT_TRUE(
        torch::allclose(Logits(*lora, b), Logits(*merged, b), 1e-4, 1e-5));
  }
}

TEST(LoraTest, MergedViewSharesTheUntargetedWeights) {
  auto lora = Make(LoraConfigOf(4, "q_proj,v_proj"));
  auto view = lora->CloneFrozen();
  int64_t targeted = 0, adapters = 0;
  for (auto& [n, t] : lora->named_parameters()) {
    if (n.find(".attn.wq.weight") != std::string::npos ||
        n.find(".attn.wv.weight") != std::string::npos) {
      targeted += t.numel() * 4;
    }
  }
  for (const at::Tensor& t : lora->trainable_parameters()) {
    adapters += t.numel() * 4;
  }
  EXPECT_EQ(ParameterBytes(*view, lora.get()), targeted + adapters);
  EXPECT_EQ(ParameterBytes(*lora),
            ParameterBytes(*Make(Plain(lora->config()))) + adapters);
}

// Adapter gradients of one training forward and backward.
std::vector<at::Tensor> AdapterGrads(PolicyModel& m, const Batch& b) {
  m.set_training(true);
  for (const at::Tensor& p : m.trainable_parameters()) {
    at::Tensor t = p;
    if (t.grad().defined()) t.mutable_grad().zero_();
  }
  m.set_lora_dropout_seed(99);
  m.Forward(b.tokens, b.positions, b.valid).square().mean().backward();
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : m.trainable_parameters()) {
    out.push_back(p.grad().clone());
  }
  return out;
}

TEST(LoraTest, RecomputedSubBlocksGiveTheKeptGradientsWithDropoutToo) {
  for (double dropout : {0.0, 0.3}) {
    ModelConfig c = LoraConfigOf(4, "all-linear");
    c.lora.dropout = dropout;
    auto kept = Make(c);
    RandomizeB(*kept, 3);
    auto recomputed = Make(c);
    recomputed->LoadTrainable(kept->trainable_parameters());
    std::vector<LayerActivationPlan> plan(c.n_layers);
    for (auto& p : plan) {
      p.attention = ActivationAction::kRecompute;
      p.mlp = ActivationAction::kRecompute;
    }
    ASSERT_TRUE(recomputed->SetActivationPlan(plan).ok());
    const Batch b = MakeBatch();
    const auto gk = AdapterGrads(*kept, b);
    const auto gr = AdapterGrads(*recomputed, b);
    ASSERT_EQ(gk.size(), gr.size());
    for (size_t i = 0; i < gk.size(); ++i) {
      EXPECT_GT(gk[i].abs().sum().item<double>(), 0) << i;
      EXPECT_TRUE(torch::allclose(gk[i], gr[i], 1e-5, 1e-7))
          << "dropout " << dropout << " tensor " << i;
    }
    if (dropout > 0) {
      // The mask follows the seed: another seed, other gradients.
      kept->set_training(true);
      for (const at::Tensor& p : kept->trainable_parameters()) {
        at::Tensor t = p;
        t.mutable_grad().zero_();
      }
      kept->set_lora_dropout_seed(100);
      kept->Forward(b.tokens, b.positions, b.valid).square().mean().backward();
      EXPECT_FALSE(torch::allclose(kept->trainable_parameters()[0].grad(),
                                   gk[0], 1e-5, 1e-7));
    }
  }
}

TEST(LoraTest, AStepChangesOnlyTheAdapters) {
  JobConfig job;
  job.model = LoraConfigOf(4, "all-linear");
  job.rollout.group_size = 4;
  job.optim.lr = 1e-2;
  auto policy = Make(job.model);
  std::vector<at::Tensor> base_before, adapters_before;
  for (const at::Tensor& p : policy->parameters()) {
    base_before.push_back(p.detach().clone());
  }
  for (const at::Tensor& p : policy->trainable_parameters()) {
    adapters_before.push_back(p.detach().clone());
  }
  auto trainer = Trainer::Create(*policy, nullptr, job, 0).value();
  std::vector<Sample> batch;
  for (int i = 0; i < 8; ++i) {
    Sample s;
    s.prompt_ids = {1, 10 + i / 4};
    s.response_ids = {20 + i, 30 + i % 3, 2};
    s.behaviour_logp.assign(3, -1.0f);
    s.reward = i % 2;
    batch.push_back(s);
  }
  // Step 1 moves B only (A's gradient is B^T (...) = 0 while B = 0), as
  // in PEFT; step 2 moves both.
  ASSERT_TRUE(trainer->Step(batch).ok());
  ASSERT_TRUE(trainer->Step(batch).ok());
  const auto base = policy->parameters();
  for (size_t i = 0; i < base.size(); ++i) {
    EXPECT_TRUE(torch::equal(base[i], base_before[i])) << "base tensor " << i;
  }
  const auto adapters = policy->trainable_parameters();
  int changed = 0;
  for (size_t i = 0; i < adapters.size(); ++i) {
    changed += !torch::equal(adapters[i], adapters_before[i]);
  }
  EXPECT_EQ(changed, static_cast<int>(adapters.size()));
  // AdamW's moments cover the adapters only: 2 x their bytes.
  int64_t adapter_bytes = 0;
  for (const at::Tensor& p : adapters) adapter_bytes += p.numel() * 4;
  EXPECT_EQ(OptimizerStateBytes(*trainer), 2 * adapter_bytes);
  EXPECT_EQ(GradientBytes(*policy), adapter_bytes);
}

// A hand batch of two groups of four (rewards 0/1).
std::vector<Sample> HandBatch() {
  std::vector<Sample> batch;
  for (int i = 0; i < 8; ++i) {
    Sample s;
    s.group_id = i / 4;
    s.prompt_ids = {1, 10 + i / 4};
    s.response_ids = {20 + i, 30 + i % 3, 2};
    s.behaviour_logp.assign(3, -1.0f);
    s.reward = i % 2;
    batch.push_back(s);
  }
  return batch;
}

// bfloat16 LoRA: one small step moves the adapters by less than bfloat16's
// spacing of almost every weight, so W + s B A rounded back to bfloat16 (the
// old merged view) is W nearly everywhere, while the trainer's unmerged
// forward has moved. The view the rollout samples from (CloneFrozen) must
// compute the trainer's forward: equal logits.
TEST(LoraTest, Bf16RolloutSamplesFromTheTrainersPolicy) {
  JobConfig job;
  job.model = LoraConfigOf(4, "all-linear");
  job.model.dtype = "bfloat16";
  job.model.init_std = 0.02;  // a language model's scale (|logits| ~ 1)
  job.rollout.group_size = 4;
  job.optim.lr = 2e-6;
  auto policy = Make(job.model);
  auto trainer = Trainer::Create(*policy, nullptr, job, 0).value();
  ASSERT_TRUE(trainer->Step(HandBatch()).ok());

  // The step's update is below bfloat16's spacing of almost every targeted
  // weight: merging it in bfloat16 gives the base back nearly everywhere.
  std::map<std::string, at::Tensor> base, adapters;
  for (auto& [n, t] : policy->named_parameters()) base[n] = t.detach();
  for (auto& [n, t] : policy->named_trainable_parameters()) {
    adapters[n] = t.detach();
  }
  int64_t slots = 0, elements = 0, moved = 0;
  for (auto& [name, b] : adapters) {
    if (name.size() < 6 || name.substr(name.size() - 6) != "lora_B") continue;
    const std::string proj = name.substr(0, name.size() - 7);
    LoraAdapter adapter;
    adapter.a = adapters.at(proj + ".lora_A");
    adapter.b = b;
    adapter.scale = job.model.lora.alpha / job.model.lora.rank;
    ASSERT_GT(b.abs().max().item<double>(), 0) << proj;
    const at::Tensor w = base.at(proj + ".weight");
    ASSERT_EQ(w.scalar_type(), torch::kBFloat16);
    moved += MergedWeight(w, adapter).ne(w).sum().item<int64_t>();
    elements += w.numel();
    ++slots;
  }
  ASSERT_EQ(slots, 14);
  EXPECT_LT(moved, elements / 20) << moved << " of " << elements;

  auto view = policy->CloneFrozen();
  EXPECT_FALSE(view->lora_merged());
  // What the rollout sampled from before: the bfloat16 merge.
  auto old_merge = Make(Plain(job.model));
  {
    torch::NoGradGuard no_grad;
    for (auto& [n, t] : old_merge->named_parameters()) {
      const std::string proj = n.substr(0, n.size() - 7);
      auto a = adapters.find(proj + ".lora_A");
      if (a == adapters.end()) {
        t.copy_(base.at(n));
        continue;
      }
      LoraAdapter adapter;
      adapter.a = a->second;
      adapter.b = adapters.at(proj + ".lora_B");
      adapter.scale = job.model.lora.alpha / job.model.lora.rank;
      t.copy_(MergedWeight(base.at(n), adapter));
    }
  }
  // The view's forward is the trainer's, bit for bit (the same bfloat16
  // projections with the adapters added unmerged); the bfloat16 merge's is
  // the base model's nearly everywhere, so its logits differ.
  const Batch b = MakeBatch();
  const at::Tensor trainer_logits = Logits(*policy, b).to(torch::kFloat);
  const double now = (Logits(*view, b).to(torch::kFloat) - trainer_logits)
                         .abs()
                         .max()
                         .item<double>();
  const double before =
      (Logits(*old_merge, b).to(torch::kFloat) - trainer_logits)
          .abs()
          .max()
          .item<double>();
  std::printf(
      "bf16 LoRA: the merge moves %lld of %lld weights; view-trainer "
      "logit gap %g (the bfloat16 merge's: %g)\n",
      static_cast<long long>(moved), static_cast<long long>(elements), now,
      before);
  EXPECT_EQ(now, 0.0) << "the rollout's view is not the trainer's policy";
  EXPECT_GT(before, 0.0) << "the case does not tell the merge apart";
}

std::string TempDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/lora-" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(LoraTest, PeftExportImportRoundTrip) {
  auto lora = Make(LoraConfigOf(4, "q_proj,v_proj,down_proj"));
  RandomizeB(*lora, 3);
  const std::string dir = TempDir("peft");
  ASSERT_TRUE(ExportPeftAdapter(*lora, dir, "/models/base").ok());

  std::ifstream in(dir + "/adapter_config.json");
  const auto config = nlohmann::json::parse(in);
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["lora_alpha"].get<double>(), 8.0);
  EXPECT_EQ(config["target_modules"],
            nlohmann::json({"q_proj", "v_proj", "down_proj"}));
  EXPECT_EQ(config["base_model_name_or_path"], "/models/base");

  auto file = SafetensorsFile::Open(dir + "/adapter_model.safetensors").value();
  const StTensorInfo* a = file->Find(
      "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  const StTensorInfo* b =
      file->Find("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{4, 32}));  // [r, in]
  EXPECT_EQ(b->shape, (std::vector<int64_t>{32, 4}));  // [out, r]
  EXPECT_EQ(file->tensors().size(), 12u);  // 2 layers x 3 targets x (A, B)

  // Another adapter init (seed), the same base: the import gives the same
  // function.
  auto other = Make(LoraConfigOf(4, "q_proj,v_proj,down_proj"), 5);
  RandomizeB(*other, 8);
  const Batch batch = MakeBatch();
  ASSERT_FALSE(torch::equal(Logits(*lora, batch), Logits(*other, batch)));
  ASSERT_TRUE(LoadPeftAdapter(dir, *other).ok());
  EXPECT_TRUE(torch::equal(Logits(*lora, batch), Logits(*other, batch)));
}

TEST(LoraTest, MergedExportIsBasePlusScaledBA) {
  auto lora = Make(LoraConfigOf(4, "all-linear"));
  RandomizeB(*lora, 3);
  const std::string dir = TempDir("merged");
  auto view = lora->CloneFrozen();
  ASSERT_TRUE(ExportHfModel(*view, dir, HfExportOptions()).ok());
  // A plain model of the architecture, loaded from the export.
  auto loaded = Make(Plain(lora->config()), 77);
  ASSERT_TRUE(LoadHfWeights(dir, *loaded).ok());
  std::map<std::string, at::Tensor> w;
  for (auto& [n, t] : loaded->named_parameters()) w[n] = t;
  for (const char* proj :
       {"block0.attn.wq", "block1.attn.wo", "block0.mlp.w1", "block1.mlp.w3"}) {
    EXPECT_TRUE(torch::allclose(w.at(std::string(proj) + ".weight"),
                                ByHand(*lora, proj), 1e-6, 1e-6))
        << proj;
  }
  const Batch batch = MakeBatch();
  EXPECT_TRUE(torch::allclose(Logits(*lora, batch), Logits(*loaded, batch),
                              1e-4, 1e-5));
  // An unmerged model (the trainer's policy, a bfloat16 view) is written
  // merged too, never as its bare base.
  const std::string unmerged_dir = TempDir("unmerged");
  ASSERT_TRUE(ExportHfModel(*lora, unmerged_dir, HfExportOptions()).ok());
  auto reloaded = Make(Plain(lora->config()), 78);
  ASSERT_TRUE(LoadHfWeights(unmerged_dir, *reloaded).ok());
  std::map<std::string, at::Tensor> w2;
  for (auto& [n, t] : reloaded->named_parameters()) w2[n] = t;
  for (const char* proj : {"block0.attn.wq", "block1.mlp.w2"}) {
    EXPECT_TRUE(torch::allclose(w2.at(std::string(proj) + ".weight"),
                                ByHand(*lora, proj), 1e-6, 1e-6))
        << proj;
  }
}

TEST(LoraTest, BadAdaptersAreRefusedByName) {
  auto rank8 = Make(LoraConfigOf(8, "q_proj"));
  const std::string dir = TempDir("rank8");
  ASSERT_TRUE(ExportPeftAdapter(*rank8, dir, "").ok());
  auto rank4 = Make(LoraConfigOf(4, "q_proj"));
  absl::Status s = LoadPeftAdapter(dir, *rank4);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("q_proj.lora_A.weight' has shape [8, 32]"),
            std::string::npos)
      << s;
  auto qv = Make(LoraConfigOf(8, "q_proj,v_proj"));
  s = LoadPeftAdapter(dir, *qv);
  EXPECT_NE(s.message().find("missing tensor "
                             "'base_model.model.model.layers.0.self_attn.v_"
                             "proj.lora_A.weight'"),
            std::string::npos)
      << s;
  auto q = Make(LoraConfigOf(8, "k_proj"));
  s = LoadPeftAdapter(dir, *q);
  EXPECT_FALSE(s.ok());
  auto full = Make(Plain(rank8->config()));
  s = LoadPeftAdapter(dir, *full);
  EXPECT_NE(s.message().find("needs a model with model.lora"),
            std::string::npos)
      << s;
  // A MoE model has no gate/up/down_proj to adapt.
  ModelConfig moe = LoraConfigOf(4, "gate_proj");
  moe.moe_experts = 4;
  auto created = PolicyModel::Create(moe, kVocab, kCpu, 1);
  ASSERT_FALSE(created.ok());
  EXPECT_NE(created.status().message().find("model.lora.targets"),
            std::string::npos);
}

TEST(LoraTest, CheckpointWeightsAreTheAdaptersOnly) {
  auto lora = Make(LoraConfigOf(4, "all-linear"));
  RandomizeB(*lora, 3);
  const std::string dir = TempDir("save");
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(lora->Save(dir + "/model.pt").ok());
  auto again = Make(LoraConfigOf(4, "all-linear"), 5);
  ASSERT_TRUE(again->Load(dir + "/model.pt").ok());
  const Batch b = MakeBatch();
  EXPECT_TRUE(torch::equal(Logits(*lora, b), Logits(*again, b)));
  // Adapters only: a file far smaller than the model.
  const auto bytes = std::filesystem::file_size(dir + "/model.pt");
  EXPECT_LT(bytes, static_cast<uintmax_t>(ParameterBytes(*lora) / 2));
  // A full model refuses it by name; a LoRA model takes a full archive's
  // base weights.
  auto full = Make(Plain(lora->config()));
  absl::Status s = full->Load(dir + "/model.pt");
  EXPECT_NE(s.message().find("holds LoRA adapters"), std::string::npos) << s;
  ASSERT_TRUE(full->Save(dir + "/full.pt").ok());
  auto from_full = Make(LoraConfigOf(4, "all-linear"), 9);
  ASSERT_TRUE(from_full->Load(dir + "/full.pt").ok());
  EXPECT_TRUE(torch::equal(from_full->parameters()[0], full->parameters()[0]));
}

}  // namespace
}  // namespace fusionrl
