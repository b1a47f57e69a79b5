// MoE expert parallelism: experts sharded over the ranks of a group, rows
// exchanged by all-to-all, against one module (or model) holding every
// expert.
#include <torch/types.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/collectives/grad_sync.h"
#include "engine/model/expert_parallel.h"
#include "engine/model/model.h"
#include "engine/model/moe.h"
#include "engine/model/moe_module.h"
#include "engine/model/moe_test_util.h"
#include "engine/model/test_util.h"
#include "engine/rollout/rollout.h"
#include "engine/train/activation_planner.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

constexpr int kPad = 0, kBos = 1, kEos = 2;

using moe_testing::MakeMoe;
using moe_testing::RandomTokens;
using moe_testing::Routed;

// Expert parallelism over a c10d (Gloo) group of two ranks: each rank holds
// half of the experts and routes its own tokens; rows travel to the
// experts' rank and back by all-to-all. Against one module holding every
// expert: each rank's outputs are that module's on the rank's tokens, the
// router's and the shared expert's gradients are that rank's own, and an
// expert's gradient is the sum over both ranks' tokens (what the
// data-parallel sum of the one-card gradients gives). With uneven token
// counts, a rank with no tokens at all, MoGE groups and mlp_act recompute.
TEST(MoeExpertParallelTest, TwoRanksEqualOneModuleInOutputsAndGradients) {
  struct Case {
    int top_k, groups;
    bool recompute;
    int64_t tokens0, tokens1;
  };
  for (const Case& k : std::vector<Case>{{2, 1, false, 13, 7},
                                         {2, 2, false, 9, 16},
                                         {1, 1, true, 11, 5},
                                         {2, 1, false, 12, 0}}) {
    SCOPED_TRACE(absl::StrCat("top ", k.top_k, " groups ", k.groups,
                              " recompute ", k.recompute, " tokens ", k.tokens0,
                              "/", k.tokens1));
    MoeFeedForward full =
        MakeMoe(4, k.top_k, 0.0, /*shared=*/true, 3, k.groups);
    full->SetRecomputeAct(k.recompute);
    const std::vector<at::Tensor> x = {RandomTokens({k.tokens0, 8}),
                                       RandomTokens({k.tokens1, 8})};
    const std::vector<at::Tensor> w = {RandomTokens({k.tokens0, 8}),
                                       RandomTokens({k.tokens1, 8})};
    // One module: outputs and gradients per rank's tokens.
    std::vector<at::Tensor> want_out(2);
    std::vector<std::map<std::string, at::Tensor>> want_grad(2);
    for (int r = 0; r < 2; ++r) {
      for (auto& p : full->parameters()) p.mutable_grad() = at::Tensor();
      want_out[r] = full->forward(x[r], Routed(at::Tensor(), false));
      // No tokens, no graph (and no gradient) on one module.
      if (want_out[r].requires_grad()) (want_out[r] * w[r]).sum().backward();
      for (const auto& item : full->named_parameters()) {
        want_grad[r][item.key()] = item.value().grad().defined()
                                       ? item.value().grad().clone()
                                       : at::zeros_like(item.value());
      }
    }
    auto group = MakeLocalGlooGroup(2, absl::Seconds(30)).value();
    std::vector<MoeFeedForward> part;
    std::vector<at::Tensor> got_out(2);
    for (int r = 0; r < 2; ++r) {
      part.emplace_back(8, 16, 4, k.top_k, k.groups, 0.0, true,
                        ExpertShard{r, 2});
      part[r]->to(torch::kDouble);
      part[r]->SetRecomputeAct(k.recompute);
      part[r]->set_expert_group(group[r].get());
      torch::NoGradGuard no_grad;
      const auto src = full->named_parameters();
      for (auto& item : part[r]->named_parameters()) {
        item.value().copy_(src[item.key()]);
      }
    }
    ASSERT_EQ(part[0]->experts.size(), 2u);
    ASSERT_EQ(part[1]->first_expert(), 2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        got_out[r] = part[r]->forward(x[r], Routed(at::Tensor(), false));
        (got_out[r] * w[r]).sum().backward();
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(got_out[r].defined());
      EXPECT_EQ(got_out[r].sizes(), want_out[r].sizes());
      if (got_out[r].numel() > 0) {
        EXPECT_LE((got_out[r] - want_out[r]).abs().max().item<double>(), 1e-12)
            << "rank " << r;
      }
      for (const auto& item : part[r]->named_parameters()) {
        const std::string& name = item.key();
        const bool expert = name.rfind("expert", 0) == 0;
        const at::Tensor want = expert ? want_grad[0][name] + want_grad[1][name]
                                       : want_grad[r][name];
        // A rank without tokens has no router or shared-expert graph.
        const at::Tensor got = item.value().grad().defined()
                                   ? item.value().grad()
                                   : at::zeros_like(item.value());
        EXPECT_TRUE(item.value().grad().defined() ||
                    (!expert && x[r].size(0) == 0))
            << name;
        EXPECT_LE((got - want).abs().max().item<double>(), 1e-12)
            << "rank " << r << " " << name;
      }
    }
  }
}

TEST(MoeExpertParallelTest, AShardWithoutItsGroupIsRefused) {
  MoeFeedForward m(8, 16, 4, 2, 1, 0.0, false, ExpertShard{1, 2});
  EXPECT_EQ(m->experts.size(), 2u);
  EXPECT_TRUE(m->named_parameters().contains("expert2.w1.weight"));
  EXPECT_FALSE(m->named_parameters().contains("expert0.w1.weight"));
  EXPECT_THROW(m->forward(torch::randn({3, 8}), Routed(at::Tensor(), false)),
               c10::Error);
  EXPECT_THROW(MoeFeedForward(8, 16, 4, 2, 1, 0.0, false, ExpertShard{0, 3}),
               c10::Error);
}

// A model's shards: the values of the whole model, their own experts only,
// gathered back bit for bit; and one activation plan per group.
TEST(MoeExpertParallelTest, ShardsGatherBackAndShareOnePlan) {
  ModelConfig c = testing_util::TinyModelConfig();
  c.moe_experts = 4;
  c.moe_top_k = 2;
  auto whole = PolicyModel::Create(c, 40, c10::Device("cpu"), 3).value();
  EXPECT_FALSE(whole->ExpertShardOf(ExpertShard{0, 3}).ok());  // 4 % 3
  auto group = MakeLocalGlooGroup(2, absl::Seconds(30)).value();
  std::vector<std::unique_ptr<PolicyModel>> shards;
  for (int r = 0; r < 2; ++r) {
    shards.push_back(whole->ExpertShardOf(ExpertShard{r, 2}).value());
    shards[r]->set_expert_group(group[r].get());
  }
  std::map<std::string, at::Tensor> values;
  for (auto& [name, t] : whole->named_parameters()) values[name] = t;
  for (int r = 0; r < 2; ++r) {
    int experts = 0;
    for (auto& [name, t] : shards[r]->named_parameters()) {
      ASSERT_TRUE(values.count(name)) << name;
      EXPECT_TRUE(at::equal(t, values[name])) << name;
      if (name.find(".mlp.expert") != std::string::npos) {
        ++experts;
        const int e = name[name.find(".mlp.expert") + 11] - '0';
        EXPECT_EQ(e / 2, r) << name;
      }
    }
    EXPECT_EQ(experts, 2 * 3 * c.n_layers);  // 2 experts x w1, w2, w3
  }
  // Different plans on the two ranks (as timings could make them): both
  // end with rank 0's; and the gathered model equals the whole one.
  std::vector<LayerActivationPlan> recompute(c.n_layers);
  for (auto& l : recompute) l.mlp = ActivationAction::kRecompute;
  ASSERT_TRUE(shards[0]->SetActivationPlan(recompute).ok());
  auto gathered = whole->CloneFrozen();
  for (auto& p : gathered->parameters()) {
    at::NoGradGuard no_grad;
    p.zero_();
  }
  std::vector<absl::Status> shared(2), gathers(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      shared[r] = ShareActivationPlan(*shards[r]);
      gathers[r] = r == 0 ? GatherExperts(*shards[0], *gathered)
                          : GatherExperts(*shards[1], *whole->CloneFrozen());
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(shared[r].ok()) << shared[r];
    ASSERT_TRUE(gathers[r].ok()) << gathers[r];
    for (const LayerActivationPlan& l : shards[r]->activation_plan()) {
      EXPECT_EQ(l.mlp, ActivationAction::kRecompute) << "rank " << r;
    }
  }
  const auto a = whole->named_parameters(), b = gathered->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
  }
}

// Rollout in the experts' layout: two ranks, each holding half of the
// experts, sample their own prompts in lockstep (a rank with fewer or
// shorter sequences, or none, joins the other's remaining forwards with no
// tokens) and get exactly what the whole model samples for the same
// prompts: tokens, log-probs and routes, bit for bit (each expert runs a
// rank's rows as its own block, as the whole model does).
TEST(MoeExpertParallelTest, RolloutInLockstepSamplesWhatTheWholeModelSamples) {
  ModelConfig c = testing_util::TinyModelConfig();
  c.moe_experts = 4;
  c.moe_top_k = 2;
  auto whole = PolicyModel::Create(c, 40, c10::Device("cpu"), 5).value();
  const std::vector<int> stops = {kEos, 7, 8};
  struct Case {
    std::vector<std::vector<int>> prompts[2];
    int max_new[2];
    RolloutEngine::DecodePath path;
  };
  const std::vector<Case> cases = {
      {{{{kBos, 11, 12}, {kBos, 13}, {kBos, 11, 12}}, {{kBos, 20, 21, 22}}},
       {8, 3},
       RolloutEngine::DecodePath::kComposite},
      {{{{kBos, 14}, {kBos, 15, 16}}, {}},
       {5, 4},
       RolloutEngine::DecodePath::kComposite},
      {{{{kBos, 17}}, {{kBos, 18, 19}, {kBos, 23}}},
       {2, 7},
       RolloutEngine::DecodePath::kStatic},
  };
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& k = cases[ci];
    SCOPED_TRACE(absl::StrCat("case ", ci));
    auto group = MakeLocalGlooGroup(2, absl::Seconds(20)).value();
    std::vector<std::unique_ptr<PolicyModel>> shards;
    std::vector<absl::StatusOr<std::vector<Completion>>> got;
    std::vector<DecodeStats> stats(2);
    for (int r = 0; r < 2; ++r) {
      shards.push_back(whole->ExpertShardOf(ExpertShard{r, 2}).value());
      shards[r]->set_expert_group(group[r].get());
      got.emplace_back(absl::UnknownError("not run"));
    }
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        RolloutEngine engine(*shards[r], kPad, stops);
        engine.set_decode_path(k.path);
        engine.set_expert_lockstep(group[r].get());
        SamplingParams params;
        params.max_new_tokens = k.max_new[r];
        try {
          got[r] = engine.Generate(k.prompts[r], params, /*seed=*/40 + r);
        } catch (const c10::Error& e) {  // an exchange timed out
          got[r] = absl::InternalError(e.what_without_backtrace());
        }
        stats[r] = engine.last_stats();
      });
    }
    for (auto& t : threads) t.join();
    int64_t forwards[2];
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status();
      forwards[r] = k.prompts[r].empty() ? 0 : 1 + stats[r].decode_steps;
    }
    for (int r = 0; r < 2; ++r) {
      // Each rank's call ran its own forwards and joined the rest.
      EXPECT_EQ(stats[r].expert_joins,
                std::max(forwards[0], forwards[1]) - forwards[r])
          << "rank " << r;
      RolloutEngine reference(*whole, kPad, stops);
      reference.set_decode_path(k.path);
      SamplingParams params;
      params.max_new_tokens = k.max_new[r];
      const auto want = reference.Generate(k.prompts[r], params, 40 + r);
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_EQ(got[r]->size(), want->size()) << "rank " << r;
      for (size_t i = 0; i < want->size(); ++i) {
        const Completion &a = (*got[r])[i], &b = (*want)[i];
        EXPECT_EQ(a.tokens, b.tokens) << "rank " << r << " sequence " << i;
        EXPECT_EQ(a.logp, b.logp) << "rank " << r << " sequence " << i;
        EXPECT_EQ(a.finished, b.finished);
        EXPECT_EQ(a.routes, b.routes) << "rank " << r << " sequence " << i;
        EXPECT_FALSE(a.routes.empty());
      }
    }
    EXPECT_NE(forwards[0], forwards[1]);  // the lockstep had work to do
  }
  // Lockstep is for expert shards: the whole model refuses it at once.
  auto group = MakeLocalGlooGroup(2, absl::Seconds(20)).value();
  RolloutEngine engine(*whole, kPad, stops);
  engine.set_expert_lockstep(group[0].get());
  EXPECT_EQ(engine.Generate({{kBos, 11}}, SamplingParams{}, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace fusionrl
