// The step protocol of JobManager, driven directly (no server, no model):
// two nodes run steps, one is lost mid-step, the attempt is aborted and
// replanned on the survivor with the lost node's groups, and every prompt
// group is trained exactly once.
#include "controller/job_manager.h"

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "controller/job_manager_proto.h"
#include "core/crc32c.h"
#include "core/fake_clock.h"
#include "core/metrics.h"
#include "core/node_registry.h"
#include "core/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/wait_watch.h"

namespace fusionrl {
namespace {

using ::testing::HasSubstr;

std::string JobYaml(const std::string& out, int steps) {
  return absl::StrCat(R"(name: jm
model: {d_model: 32, n_layers: 1, n_heads: 2, d_ff: 64, max_seq_len: 24}
task: {name: reverse, eval_size: 10, min_digits: 1, max_digits: 3}
rollout: {prompts_per_step: 4, group_size: 2, max_new_tokens: 5}
placement: {super_nodes: 2, cards_per_super_node: 1}
run: {eval_every: 0, total_steps: )",
                      steps, "}\noutput_dir: \"", out, "\"\n");
}

// The deadline of the test's calls, on the manager's (fake) clock: longer
// than the tests move the clock while a call waits (11 s to lose a node).
constexpr absl::Duration kCallWait = absl::Minutes(1);

// Real time a test gives a thread it started to block inside a call
// (CondVarWaitWatch); the calls cannot end meanwhile, as the fake clock
// does not move.
constexpr absl::Duration kBlockWithin = absl::Seconds(30);

// How often each prompt group index appears in the plans' groups.
std::map<uint64_t, int> GroupCounts(const std::vector<v1::StepPlan>& plans) {
  std::map<uint64_t, int> counts;
  for (const v1::StepPlan& p : plans) {
    for (uint64_t g : p.groups()) ++counts[g];
  }
  return counts;
}

// Every index in [0, n) exactly once.
std::map<uint64_t, int> EachOnce(int64_t n) {
  std::map<uint64_t, int> counts;
  for (int64_t g = 0; g < n; ++g) counts[static_cast<uint64_t>(g)] = 1;
  return counts;
}

class JobManagerTest : public ::testing::Test {
 protected:
  JobManagerTest()
      : clock_(absl::FromUnixSeconds(1000)),
        registry_(clock_, absl::Seconds(10)),
        jobs_(registry_, clock_) {}

  std::string AddNode(const std::string& super_node) {
    NodeSpec spec;
    spec.host = "h";
    spec.super_node = super_node;
    spec.cards = {CardSpec{0, "cpu", 0}};
    auto id = registry_.Register(spec);
    EXPECT_TRUE(id.ok()) << id.status();
    jobs_.Schedule();
    return *id;
  }

  v1::StepPlan Plan(const std::string& job, const std::string& node,
                    int64_t step) {
    v1::GetStepPlanRequest r;
    r.set_job_id(job);
    r.set_node_id(node);
    r.set_step(step);
    auto plan = rpc::GetStepPlan(jobs_, r);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *plan : v1::StepPlan();
  }

  absl::StatusOr<std::string> Reduce(const std::string& job,
                                     const std::string& node,
                                     const v1::StepPlan& plan, int64_t round,
                                     float value) {
    v1::ReduceRequest r;
    r.set_job_id(job);
    r.set_node_id(node);
    r.set_step(plan.step());
    r.set_attempt(plan.attempt());
    r.set_round(round);
    r.set_dtype(v1::REDUCE_DTYPE_FLOAT32);
    r.set_payload(std::string(reinterpret_cast<const char*>(&value), 4));
    return rpc::Reduce(jobs_, r, kCallWait);
  }

  absl::StatusOr<v1::FinishStepResponse> Finish(const std::string& job,
                                                const std::string& node,
                                                const v1::StepPlan& plan) {
    v1::FinishStepRequest r;
    r.set_job_id(job);
    r.set_node_id(node);
    r.set_step(plan.step());
    r.set_attempt(plan.attempt());
    r.set_initial_eval_accuracy(-1);
    r.set_eval_accuracy(-1);
    r.set_metrics_json(absl::StrCat("{\"step\": ", plan.step(), "}"));
    return rpc::FinishStep(jobs_, r, kCallWait);
  }

  std::string Submit(int steps) {
    out_ = ::testing::TempDir() + "/job-manager-test";
    std::filesystem::remove_all(out_);
    v1::SubmitJobRequest r;
    r.set_config_yaml(JobYaml(out_, steps));
    auto id = rpc::SubmitJob(jobs_, r);
    EXPECT_TRUE(id.ok()) << id.status();
    return *id;
  }

  // A job on one super node (placed on the first free node).
  std::string SubmitOn1Node(int steps) {
    v1::SubmitJobRequest r;
    r.set_config_yaml(
        JobYaml(::testing::TempDir() + "/job-manager-one", steps));
    r.add_overrides("placement.super_nodes=1");
    auto id = rpc::SubmitJob(jobs_, r);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or("");
  }

  std::string SubmitSkewed(int steps, int k,
                           const std::vector<std::string>& overrides = {}) {
    out_ = ::testing::TempDir() + "/job-manager-skew";
    std::filesystem::remove_all(out_);
    v1::SubmitJobRequest r;
    r.set_config_yaml(JobYaml(out_, steps));
    r.add_overrides(absl::StrCat("stalesync.max_clock_skew=", k));
    for (const std::string& o : overrides) r.add_overrides(o);
    auto id = rpc::SubmitJob(jobs_, r);
    EXPECT_TRUE(id.ok()) << id.status();
    return *id;
  }

  // Hands in `value` as node's update of (step, round 0); returns the values
  // received, as "node:step=value".
  absl::StatusOr<std::vector<std::string>> Exchange(
      const std::string& job, const std::string& node, int64_t step,
      int64_t due_step, float value, int attempt = 1) {
    v1::ExchangeUpdatesRequest r;
    r.set_job_id(job);
    r.set_due_step(due_step);
    r.set_attempt(attempt);
    v1::GradientUpdate* u = r.mutable_update();
    u->set_node_id(node);
    u->set_step(step);
    u->set_round(0);
    u->set_payload(std::string(reinterpret_cast<const char*>(&value), 4));
    u->set_crc32c(Crc32c(u->payload()));
    FUSIONRL_ASSIGN_OR_RETURN(v1::ExchangeUpdatesResponse got,
                              rpc::ExchangeUpdates(jobs_, r, kCallWait));
    std::vector<std::string> out;
    for (const v1::GradientUpdate& g : got.updates()) {
      float f = 0;
      std::memcpy(&f, g.payload().data(), 4);
      out.push_back(absl::StrCat(g.node_id(), ":", g.step(), "=", f));
    }
    return out;
  }

  // The "step" of every line of the job's metrics.jsonl, in file order.
  std::vector<int64_t> MetricsSteps() {
    std::vector<int64_t> steps;
    const std::string text =
        ReadTextFile(out_ + "/metrics.jsonl", "metrics").value_or("");
    for (absl::string_view line :
         absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      const size_t at = line.find("\"step\":");
      int64_t step = -1;
      if (at != absl::string_view::npos) {
        absl::string_view rest = line.substr(at + 7);
        rest = rest.substr(0, rest.find_first_of(",}"));
        if (!absl::SimpleAtoi(rest, &step)) step = -1;
      }
      steps.push_back(step);
    }
    return steps;
  }

  int64_t SkewSeen(const std::string& job) {
    auto st = jobs_.Status(job);
    EXPECT_TRUE(st.ok());
    return st.ok() ? st->max_clock_skew_seen : -1;
  }

  FakeClock clock_;
  NodeRegistry registry_;
  JobManager jobs_;
  std::string out_;
};

float AsFloat(const std::string& bytes) {
  float f = 0;
  std::memcpy(&f, bytes.data(), 4);
  return f;
}

TEST_F(JobManagerTest, TwoNodesSumInNodeOrderAndCommitTogether) {
  const std::string a = AddNode("a"), b = AddNode("b");
  const std::string job = Submit(1);
  const v1::StepPlan pa = Plan(job, a, 0), pb = Plan(job, b, 0);
  ASSERT_EQ(pa.kind(), v1::PLAN_KIND_TRAIN);
  EXPECT_EQ(pa.rank(), 0);
  EXPECT_EQ(pb.rank(), 1);
  EXPECT_EQ(pa.world_size(), 2);
  EXPECT_EQ(pa.nodes(), 2);
  EXPECT_TRUE(pa.eval_before());
  EXPECT_FALSE(pb.eval_before());
  // Contiguous groups per rank: 0,1 and 2,3.
  EXPECT_THAT(pa.groups(), ::testing::ElementsAre(0, 1));
  EXPECT_THAT(pb.groups(), ::testing::ElementsAre(2, 3));

  absl::StatusOr<std::string> sum_b;
  std::thread tb([&] { sum_b = Reduce(job, b, pb, 0, 2.5f); });
  auto sum_a = Reduce(job, a, pa, 0, 1.0f);
  tb.join();
  ASSERT_TRUE(sum_a.ok()) << sum_a.status();
  ASSERT_TRUE(sum_b.ok()) << sum_b.status();
  EXPECT_EQ(AsFloat(*sum_a), 3.5f);
  EXPECT_EQ(*sum_a, *sum_b);

  absl::StatusOr<v1::FinishStepResponse> done_b;
  std::thread fb([&] { done_b = Finish(job, b, pb); });
  auto done_a = Finish(job, a, pa);
  fb.join();
  ASSERT_TRUE(done_a.ok() && done_b.ok());
  EXPECT_TRUE(done_a->committed());
  EXPECT_TRUE(done_b->committed());
  // The job now ends: the lead writes the final checkpoint.
  const v1::StepPlan end = Plan(job, a, 2);
  EXPECT_EQ(end.kind(), v1::PLAN_KIND_END);
  EXPECT_EQ(end.checkpoint_name(), "final");
  ASSERT_TRUE(Finish(job, a, end).ok());
  auto status = jobs_.Status(job);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->phase, JobPhase::kSucceeded);
  EXPECT_EQ(status->groups_trained, 4);
  // The lead's record, then the controller's run-level fields.
  EXPECT_EQ(status->last_metrics_json,
            // Through the controller: 2 nodes x 4 bytes in, 4 bytes back.
            "{\"step\":1,\"tokens_per_second\":0,"
            "\"controller_tensor_bytes\":16}");
  EXPECT_TRUE(std::filesystem::exists(out_ + "/summary.json"));
}

// a has handed in its part of round 0 and waits in the round for b when b
// is lost: a's Reduce ends ABORTED, the attempt is not committed, and a
// alone trains step 1 again and then step 2. The committed steps train
// every submitted group exactly once, the lost node's two included.
// The c10d data plane's rendezvous: one generation while the attempt's
// nodes stay the same, a new one (and the old one closed) when a node
// aborts the attempt or is lost; only the job's nodes, only at the current
// generation, may use the store.
TEST_F(JobManagerTest, RendezvousGenerationsFollowTheAttemptsNodes) {
  const std::string a = AddNode("a"), b = AddNode("b");
  const std::string job = Submit(3);
  const v1::StepPlan pa = Plan(job, a, 0), pb = Plan(job, b, 0);
  EXPECT_EQ(pa.node_rank(), 0);
  EXPECT_EQ(pb.node_rank(), 1);
  const int64_t g1 = pa.rendezvous_generation();
  EXPECT_GE(g1, 1);
  EXPECT_EQ(pb.rendezvous_generation(), g1);

  auto store = [&](const std::string& node, int64_t generation, StoreOp op,
                   const std::string& key, const std::string& value = "") {
    StoreCall c;
    c.job_id = job;
    c.node_id = node;
    c.generation = generation;
    c.op = op;
    c.keys = {key};
    c.value = value;
    return jobs_.Store(c, absl::Seconds(1));
  };
  ASSERT_TRUE(store(a, g1, StoreOp::kSet, "addr/0", "a:1").ok());
  auto got = store(b, g1, StoreOp::kGet, "addr/0");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->value, "a:1");
  // Not a node of the job; not the current generation.
  EXPECT_FALSE(store("stranger", g1, StoreOp::kGet, "addr/0").ok());
  EXPECT_EQ(store(a, g1 + 1, StoreOp::kGet, "addr/0").status().code(),
            absl::StatusCode::kAborted);

  // Step 1 commits: step 2 keeps the generation (same nodes, the group
  // lives on).
  absl::StatusOr<v1::FinishStepResponse> done_b;
  std::thread tb([&] { done_b = Finish(job, b, pb); });
  auto done_a = Finish(job, a, pa);
  tb.join();
  ASSERT_TRUE(done_a.ok() && done_b.ok());
  ASSERT_TRUE(done_a->committed());
  const v1::StepPlan pa2 = Plan(job, a, 2);
  EXPECT_EQ(pa2.rendezvous_generation(), g1);
  EXPECT_EQ(store(b, g1, StoreOp::kGet, "addr/0")->value, "a:1");

  // b's collective failed: it aborts the attempt; the step is replanned on
  // the same nodes at a new generation, and the old one is closed.
  v1::FinishStepRequest abort;
  abort.set_job_id(job);
  abort.set_node_id(b);
  abort.set_step(2);
  abort.set_attempt(pa2.attempt());
  abort.set_abort_reason("all-reduce: connection reset by peer");
  auto r = rpc::FinishStep(jobs_, abort, kCallWait);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->committed());
  const v1::StepPlan pa3 = Plan(job, a, 2);
  EXPECT_EQ(pa3.attempt(), pa2.attempt() + 1);
  EXPECT_EQ(pa3.world_size(), 2);
  EXPECT_GT(pa3.rendezvous_generation(), g1);
  EXPECT_EQ(store(b, g1, StoreOp::kGet, "addr/0").status().code(),
            absl::StatusCode::kAborted);
  // A replayed abort of the old attempt changes nothing.
  ASSERT_TRUE(rpc::FinishStep(jobs_, abort, kCallWait).ok());
  EXPECT_EQ(Plan(job, a, 2).attempt(), pa3.attempt());

  // Aborts of the same step are bounded: the job fails after a few in a
  // row, naming the last reason.
  for (int i = 0; i < 3; ++i) {
    const v1::StepPlan p = Plan(job, a, 2);
    abort.set_attempt(p.attempt());
    ASSERT_TRUE(rpc::FinishStep(jobs_, abort, kCallWait).ok());
  }
  auto status = jobs_.Status(job);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->phase, JobPhase::kFailed);
  EXPECT_THAT(status->message, HasSubstr("connection reset by peer"));
  // No tensor went through the controller in all this.
  EXPECT_EQ(status->controller_tensor_bytes, 0);
}

TEST_F(JobManagerTest, ALostNodeAbortsTheStepAndItsGroupsAreTrainedOnce) {
  const std::string a = AddNode("a"), b = AddNode("b");
  const std::string job = Submit(2);
  const v1::StepPlan pa = Plan(job, a, 0), pb = Plan(job, b, 0);
  EXPECT_THAT(pa.groups(), ::testing::ElementsAre(0, 1));
  EXPECT_THAT(pb.groups(), ::testing::ElementsAre(2, 3));
  // a waits in a round that b never joins: b is lost.
  CondVarWaitWatch watch(jobs_);
  absl::StatusOr<std::string> stuck;
  std::atomic<bool> returned{false};
  std::thread ta([&] {
    stuck = Reduce(job, a, pa, 0, 1.0f);
    returned.store(true);
  });
  // a's part is in and a waits in the round (the clock has not moved, b
  // sent nothing: it cannot return yet).
  const bool blocked = watch.AwaitWaits(1, kBlockWithin);
  EXPECT_TRUE(blocked) << "a's Reduce never waited in the round";
  EXPECT_FALSE(returned.load());
  clock_.Advance(absl::Seconds(6));
  EXPECT_TRUE(registry_.Heartbeat(a).ok());
  clock_.Advance(absl::Seconds(5));
  const std::vector<std::string> lost = registry_.SweepLost();
  EXPECT_EQ(lost, std::vector<std::string>{b});
  EXPECT_FALSE(returned.load());  // 11 s < the round's deadline
  jobs_.NodesLost({b}, "no heartbeat");
  ta.join();
  ASSERT_TRUE(blocked);
  ASSERT_TRUE(absl::IsAborted(stuck.status())) << stuck.status();
  // Aborted while it waited in the round, not refused at the door.
  EXPECT_THAT(std::string(stuck.status().message()), HasSubstr("was aborted"));
  // a's end-of-step report of the aborted attempt is not committed.
  auto late = Finish(job, a, pa);
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(late->committed());

  auto status = jobs_.Status(job);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->groups_requeued, 2);
  bool saw_lost = false;
  for (const auto& n : status->nodes) saw_lost |= n.state == "lost";
  EXPECT_TRUE(saw_lost);
  bool event = false;
  for (const auto& e : status->events) {
    event |= e.text.find("lost") != std::string::npos;
  }
  EXPECT_TRUE(event);

  // a runs the job to its end alone; keep every plan it is given and the
  // ones whose step committed.
  std::vector<v1::StepPlan> given = {pa};
  std::vector<v1::StepPlan> committed;
  for (int64_t step = 1; step <= 2; ++step) {
    SCOPED_TRACE(step);
    const v1::StepPlan p = Plan(job, a, step);
    ASSERT_EQ(p.kind(), v1::PLAN_KIND_TRAIN);
    ASSERT_EQ(p.step(), step);
    EXPECT_EQ(p.world_size(), 1);
    given.push_back(p);
    auto done = Finish(job, a, p);
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_TRUE(done->committed());
    committed.push_back(p);
  }
  EXPECT_EQ(given[1].attempt(), pa.attempt() + 1);  // step 1, replanned
  const v1::StepPlan end = Plan(job, a, 3);
  ASSERT_EQ(end.kind(), v1::PLAN_KIND_END);
  EXPECT_TRUE(end.groups().empty());
  ASSERT_TRUE(Finish(job, a, end).ok());
  status = jobs_.Status(job);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->phase, JobPhase::kSucceeded);
  // The committed steps cover every submitted group, none twice, none
  // missing; b's groups went to a in the replanned attempt.
  EXPECT_EQ(status->groups_submitted, 8);
  EXPECT_EQ(GroupCounts(committed), EachOnce(status->groups_submitted));
  EXPECT_THAT(given[1].groups(), ::testing::IsSupersetOf({2u, 3u}));
  EXPECT_EQ(status->groups_trained, 8);
}

TEST_F(JobManagerTest, ReplannedAttemptGivesTheSurvivorEveryGroupOnce) {
  const std::string a = AddNode("a"), b = AddNode("b");
  const std::string job = Submit(2);
  const v1::StepPlan pa = Plan(job, a, 0);
  jobs_.NodesLost({b}, "test");
  // a's next plan for step 1 is attempt 2 with all four groups.
  const v1::StepPlan again = Plan(job, a, 1);
  ASSERT_EQ(again.kind(), v1::PLAN_KIND_TRAIN);
  EXPECT_EQ(again.step(), 1);
  EXPECT_EQ(again.attempt(), pa.attempt() + 1);
  EXPECT_EQ(again.world_size(), 1);
  EXPECT_EQ(again.nodes(), 1);
  EXPECT_THAT(again.groups(), ::testing::ElementsAre(0, 1, 2, 3));
  // b is out: its calls are refused.
  v1::GetStepPlanRequest r;
  r.set_job_id(job);
  r.set_node_id(b);
  r.set_step(1);
  EXPECT_EQ(rpc::GetStepPlan(jobs_, r).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // a runs both steps alone; both commit.
  auto done = Finish(job, a, again);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(done->committed());
  const v1::StepPlan two = Plan(job, a, 2);
  EXPECT_THAT(two.groups(), ::testing::ElementsAre(4, 5, 6, 7));
  done = Finish(job, a, two);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(done->committed());
  const v1::StepPlan end = Plan(job, a, 3);
  ASSERT_EQ(end.kind(), v1::PLAN_KIND_END);
  ASSERT_TRUE(Finish(job, a, end).ok());
  auto status = jobs_.Status(job);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->phase, JobPhase::kSucceeded);
  EXPECT_EQ(status->groups_submitted, 8);
  // The two committed steps train each submitted group once.
  EXPECT_EQ(GroupCounts({again, two}), EachOnce(status->groups_submitted));
  EXPECT_EQ(status->groups_trained, 8);
  EXPECT_EQ(status->groups_requeued, 2);
}

// An in-process caller submits the struct: the cards' assignment carries
// that config, and a struct that fails validation or cannot be split over
// the cards is refused naming its key (and its job's name).
TEST_F(JobManagerTest, ASubmittedStructIsTheConfigTheCardsGet) {
  const std::string a = AddNode("a");
  AddNode("b");
  JobSubmission submission;
  submission.config.name = "typed";
  submission.config.model.d_model = 32;
  submission.config.model.n_layers = 1;
  submission.config.model.n_heads = 2;
  submission.config.model.d_ff = 64;
  submission.config.model.max_seq_len = 24;
  submission.config.rollout.prompts_per_step = 4;
  submission.config.rollout.group_size = 2;
  submission.config.placement.super_nodes = 2;
  submission.config.run.total_steps = 1;
  submission.config.output_dir = ::testing::TempDir() + "/job-manager-typed";
  std::filesystem::remove_all(submission.config.output_dir);
  JobSubmission uneven = submission;
  uneven.config.rollout.prompts_per_step = 3;
  EXPECT_THAT(std::string(jobs_.Submit(uneven).status().message()),
              HasSubstr("typed: rollout.prompts_per_step: must be a multiple "
                        "of the job's 2 training cards"));
  JobSubmission invalid = submission;
  invalid.config.rollout.group_size = 0;
  EXPECT_EQ(jobs_.Submit(invalid).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto job = jobs_.Submit(submission);
  ASSERT_TRUE(job.ok()) << job.status();
  auto assigned = jobs_.GetAssignment(a, absl::ZeroDuration());
  ASSERT_TRUE(assigned.ok()) << assigned.status();
  ASSERT_NE(assigned->config, nullptr);
  EXPECT_EQ(JobConfigToYaml(*assigned->config),
            JobConfigToYaml(submission.config));
  EXPECT_EQ(assigned->config->name, "typed");
}

TEST_F(JobManagerTest, GroupsThatCannotBeSplitEvenlyFailTheJobWithTheReason) {
  const std::string a = AddNode("a"), b = AddNode("b");
  v1::SubmitJobRequest r;
  out_ = ::testing::TempDir() + "/job-manager-uneven";
  r.set_config_yaml(JobYaml(out_, 2));
  r.add_overrides("placement.cards_per_super_node=1");
  r.add_overrides("rollout.prompts_per_step=2");
  auto job = rpc::SubmitJob(jobs_, r);
  ASSERT_TRUE(job.ok());
  // 2 groups over 2 nodes; after a loss, 2 groups over 1 card still divide,
  // so lose both: no node left.
  jobs_.NodesLost({a, b}, "test");
  auto status = jobs_.Status(*job);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->phase, JobPhase::kFailed);
  EXPECT_THAT(status->message, HasSubstr("no node left"));
  EXPECT_NE(status->error_code, 0);
}

TEST_F(JobManagerTest, CancelEndsAfterTheCurrentStepWithACheckpoint) {
  const std::string a = AddNode("a"), b = AddNode("b");
  const std::string job = Submit(5);
  const v1::StepPlan pa = Plan(job, a, 0), pb = Plan(job, b, 0);
  ASSERT_TRUE(jobs_.Cancel(job, "operator").ok());
  std::thread fb([&] { ASSERT_TRUE(Finish(job, b, pb).ok()); });
  ASSERT_TRUE(Finish(job, a, pa).ok());
  fb.join();
  const v1::StepPlan end = Plan(job, a, 2);
  ASSERT_EQ(end.kind(), v1::PLAN_KIND_END);
  EXPECT_EQ(end.checkpoint_name(), "step_1");
  ASSERT_TRUE(Finish(job, a, end).ok());
  auto status = jobs_.Status(job);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->phase, JobPhase::kCancelled);
  EXPECT_EQ(status->step, 1);
  EXPECT_THAT(status->summary_json, HasSubstr("\"interrupted\": true"));
}

// StaleSync across super nodes, k = 1: a node may run one step ahead of the
// slowest, never two; its exchange waits for the updates k steps old; every
// update reaches the other node exactly once, in order; steps commit in
// order once both nodes finished them; the last step syncs the weights.
TEST_F(JobManagerTest, ClockSkewGatesPlansAndUpdatesArriveOnce) {
  const std::string a = AddNode("a"), b = AddNode("b");
  const std::string job = SubmitSkewed(3, 1);
  v1::StepPlan a1 = Plan(job, a, 0), b1 = Plan(job, b, 0);
  ASSERT_EQ(a1.kind(), v1::PLAN_KIND_TRAIN);
  EXPECT_TRUE(a1.exchange_updates());
  EXPECT_EQ(a1.updates_due_step(), 0);
  EXPECT_FALSE(a1.sync_weights());
  EXPECT_EQ(a1.step(), 1);
  EXPECT_EQ(b1.rank(), 1);
  // Step 1: nothing is due yet, nothing from b has arrived.
  auto got = Exchange(job, a, 1, a1.updates_due_step(), 1.0f);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->empty());
  ASSERT_TRUE(Finish(job, a, a1).ok());
  // a at clock 1, b at 0: a may start step 2 (1 - 0 <= k)...
  const v1::StepPlan a2 = Plan(job, a, 2);
  ASSERT_EQ(a2.kind(), v1::PLAN_KIND_TRAIN);
  EXPECT_EQ(a2.updates_due_step(), 1);
  EXPECT_THAT(a2.groups(), ::testing::ElementsAre(4, 5));  // step 2's
  // ...but its exchange waits for b's update of step 1: a has handed in its
  // update of step 2 and waits when b exchanges, so b's answer shows that
  // an update ahead of b's own step is held back.
  CondVarWaitWatch watch(jobs_);
  absl::StatusOr<std::vector<std::string>> got_a;
  std::atomic<bool> a_returned{false};
  std::thread ta([&] {
    got_a = Exchange(job, a, 2, 1, 3.0f);
    a_returned.store(true);
  });
  const bool a_waits = watch.AwaitWaits(1, kBlockWithin);
  EXPECT_TRUE(a_waits) << "a's exchange never waited for b";
  EXPECT_FALSE(a_returned.load());
  auto got_b = Exchange(job, b, 1, b1.updates_due_step(), 2.0f);
  ta.join();
  ASSERT_TRUE(a_waits);
  ASSERT_TRUE(got_b.ok()) << got_b.status();
  EXPECT_THAT(*got_b, ::testing::ElementsAre(a + ":1=1"));  // not (2): ahead
  ASSERT_TRUE(got_a.ok()) << got_a.status();
  EXPECT_THAT(*got_a, ::testing::ElementsAre(b + ":1=2"));
  ASSERT_TRUE(Finish(job, a, a2).ok());
  EXPECT_EQ(SkewSeen(job), 2);  // a at 2, b at 0: k + 1, never more
  // a at clock 2 may not start step 3 while b is at 0.
  v1::GetStepPlanRequest wait;
  wait.set_job_id(job);
  wait.set_node_id(a);
  wait.set_step(3);
  auto blocked = rpc::GetStepPlan(jobs_, wait);
  ASSERT_TRUE(blocked.ok());
  EXPECT_EQ(blocked->kind(), v1::PLAN_KIND_WAIT);
  ASSERT_TRUE(Finish(job, b, b1).ok());
  auto st = jobs_.Status(job);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->step, 1);  // step 1 committed: both finished it
  // The last step is a sync step: its exchange waits for everything.
  const v1::StepPlan a3 = Plan(job, a, 3);
  ASSERT_EQ(a3.kind(), v1::PLAN_KIND_TRAIN);
  EXPECT_TRUE(a3.sync_weights());
  EXPECT_EQ(a3.updates_due_step(), 3);
  const v1::StepPlan b2 = Plan(job, b, 2);
  got_b = Exchange(job, b, 2, b2.updates_due_step(), 4.0f);
  ASSERT_TRUE(got_b.ok());
  EXPECT_THAT(*got_b, ::testing::ElementsAre(a + ":2=3"));
  ASSERT_TRUE(Finish(job, b, b2).ok());
  const v1::StepPlan b3 = Plan(job, b, 3);
  std::thread tb([&] { got_b = Exchange(job, b, 3, 3, 6.0f); });
  got_a = Exchange(job, a, 3, 3, 5.0f);
  tb.join();
  ASSERT_TRUE(got_a.ok() && got_b.ok());
  EXPECT_THAT(*got_a, ::testing::ElementsAre(b + ":2=4", b + ":3=6"));
  EXPECT_THAT(*got_b, ::testing::ElementsAre(a + ":3=5"));
  // Each reports its weights' CRC after the sync; the job ends.
  for (const auto& [node, plan] : {std::pair{a, a3}, std::pair{b, b3}}) {
    v1::FinishStepRequest r;
    r.set_job_id(job);
    r.set_node_id(node);
    r.set_step(3);
    r.set_attempt(plan.attempt());
    r.set_initial_eval_accuracy(-1);
    r.set_eval_accuracy(-1);
    r.set_weights_crc32c(0xabcd);
    r.set_has_weights_crc32c(true);
    ASSERT_TRUE(rpc::FinishStep(jobs_, r, absl::Seconds(5)).ok());
  }
  const v1::StepPlan end = Plan(job, a, 4);
  ASSERT_EQ(end.kind(), v1::PLAN_KIND_END);
  ASSERT_TRUE(Finish(job, a, end).ok());
  st = jobs_.Status(job);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase, JobPhase::kSucceeded);
  EXPECT_EQ(st->groups_trained, 12);
  EXPECT_EQ(st->max_clock_skew_seen, 2);
  EXPECT_THAT(st->summary_json, HasSubstr("\"max_clock_skew_seen\": 2"));
  EXPECT_THAT(st->summary_json, HasSubstr("\"a\": 43981"));
  EXPECT_THAT(st->summary_json, HasSubstr("\"b\": 43981"));
}

TEST_F(JobManagerTest, ALostSuperNodeRollsAClockSkewJobBackToItsLastSync) {
  const std::string a = AddNode("a"), b = AddNode("b"), c = AddNode("c");
  // Sync (checkpoint) steps 2, 4 and the last, 6; 6 groups a step.
  const std::string job =
      SubmitSkewed(6, 1,
                   {"placement.super_nodes=3", "rollout.prompts_per_step=6",
                    "run.checkpoint_every=2"});
  // Every node in `nodes` plans `step`, hands in its update and finishes
  // it (a sync step's exchange waits for all: the calls run on threads).
  auto run_step = [&](const std::vector<std::string>& nodes, int64_t step,
                      int attempt) {
    std::vector<v1::StepPlan> plans;
    for (const std::string& n : nodes) {
      plans.push_back(Plan(job, n, step));
      ASSERT_EQ(plans.back().kind(), v1::PLAN_KIND_TRAIN) << n << " " << step;
      ASSERT_EQ(plans.back().step(), step);
      ASSERT_EQ(plans.back().attempt(), attempt);
    }
    std::vector<std::thread> threads;
    for (size_t i = 0; i < nodes.size(); ++i) {
      threads.emplace_back([&, i] {
        auto got = Exchange(job, nodes[i], step, plans[i].updates_due_step(),
                            1.0f, attempt);
        EXPECT_TRUE(got.ok()) << got.status();
      });
    }
    for (std::thread& th : threads) th.join();
    for (size_t i = 0; i < nodes.size(); ++i) {
      auto done = Finish(job, nodes[i], plans[i]);
      ASSERT_TRUE(done.ok()) << done.status();
      EXPECT_TRUE(done->committed());
    }
  };
  run_step({a, b, c}, 1, 1);
  run_step({a, b, c}, 2, 1);  // the weight sync of step 2
  run_step({a, b, c}, 3, 1);
  // a and b start step 4; c is lost before it finishes it.
  const v1::StepPlan a4 = Plan(job, a, 4);
  ASSERT_EQ(a4.kind(), v1::PLAN_KIND_TRAIN);
  EXPECT_FALSE(a4.has_rollback_to_step());
  ASSERT_EQ(Plan(job, c, 4).kind(), v1::PLAN_KIND_TRAIN);
  auto st = jobs_.Status(job);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->step, 3);
  EXPECT_EQ(st->groups_trained, 18);
  jobs_.NodesLost({c}, "test");

  // Back to the sync of step 2: step 3 uncommitted, its record dropped.
  st = jobs_.Status(job);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase, JobPhase::kRunning) << st->message;
  EXPECT_EQ(st->step, 2);
  EXPECT_EQ(st->groups_trained, 12);
  bool rolled_back_event = false;
  for (const JobEvent& e : st->events) {
    rolled_back_event =
        rolled_back_event || absl::StrContains(e.text,
                                               "back to the weight sync "
                                               "of step 2");
  }
  EXPECT_TRUE(rolled_back_event);
  EXPECT_THAT(MetricsSteps(), ::testing::ElementsAre(1, 2));
  // What a ran of the old attempt counts for nothing.
  auto stale_update = Exchange(job, a, 4, 3, 1.0f, /*attempt=*/1);
  EXPECT_EQ(stale_update.status().code(), absl::StatusCode::kAborted);
  auto stale = Finish(job, a, a4);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_FALSE(stale->committed());
  // a asks for step 5 as it would have: it gets step 3 of attempt 2, which
  // restores the sync of step 2, now over two super nodes (3 groups each).
  const v1::StepPlan a3 = Plan(job, a, 5);
  ASSERT_EQ(a3.kind(), v1::PLAN_KIND_TRAIN);
  EXPECT_EQ(a3.step(), 3);
  EXPECT_EQ(a3.attempt(), 2);
  ASSERT_TRUE(a3.has_rollback_to_step());
  EXPECT_EQ(a3.rollback_to_step(), 2);
  EXPECT_EQ(a3.nodes(), 2);
  EXPECT_EQ(a3.groups_size(), 3);
  EXPECT_GT(a3.rendezvous_generation(), a4.rendezvous_generation());
  // The lost node is out of the job.
  v1::GetStepPlanRequest from_c;
  from_c.set_job_id(job);
  from_c.set_node_id(c);
  from_c.set_step(5);
  auto c_plan = rpc::GetStepPlan(jobs_, from_c);
  EXPECT_TRUE(!c_plan.ok() || c_plan->kind() != v1::PLAN_KIND_TRAIN);

  for (int64_t step = 3; step <= 6; ++step) run_step({a, b}, step, 2);
  const v1::StepPlan end = Plan(job, a, 7);
  ASSERT_EQ(end.kind(), v1::PLAN_KIND_END);
  ASSERT_TRUE(Finish(job, a, end).ok());
  st = jobs_.Status(job);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase, JobPhase::kSucceeded) << st->message;
  EXPECT_EQ(st->groups_trained, 36);
  EXPECT_EQ(st->groups_submitted, 36);
  // Steps 1..6, each once.
  EXPECT_THAT(MetricsSteps(), ::testing::ElementsAre(1, 2, 3, 4, 5, 6));
}

// The watchdog: a step that makes no progress is named with what each card
// is doing (from heartbeats), then replanned, and after a few replans with
// no progress the job fails saying so; a job that commits is left alone.
TEST_F(JobManagerTest, TheWatchdogNamesWhatEachCardDoesThenReplansOrFails) {
  const std::string a = AddNode("a"), b = AddNode("b");
  const std::string job = Submit(3);
  const v1::StepPlan pa = Plan(job, a, 0);
  ASSERT_EQ(pa.kind(), v1::PLAN_KIND_TRAIN);
  CardReport busy;
  busy.index = 0;
  busy.activity = "all-reduce round 2 of step 1";
  busy.activity_seconds = 95;
  jobs_.RecordCardStates(b, {busy});
  clock_.Advance(absl::Seconds(50));
  jobs_.CheckStalls(absl::Seconds(60), JobManager::StallAction::kReplan);
  EXPECT_EQ(Plan(job, a, 1).attempt(), 1);  // not yet stalled
  clock_.Advance(absl::Seconds(20));
  jobs_.CheckStalls(absl::Seconds(60), JobManager::StallAction::kReplan);
  auto st = jobs_.Status(job);
  ASSERT_TRUE(st.ok());
  const std::string last = st->events.rbegin()->text;
  EXPECT_THAT(last, HasSubstr("no step committed for 1m10s (step 1 in flight"));
  EXPECT_THAT(last,
              HasSubstr(absl::StrCat(
                  "card ", b, "/0: all-reduce round 2 of step 1 for 95 s")));
  EXPECT_THAT(last, HasSubstr(absl::StrCat("card ", a, "/0: no report")));
  EXPECT_THAT(last, HasSubstr("replanning"));
  EXPECT_EQ(Plan(job, a, 1).attempt(), 2);
  // Replanned kMaxDataPlaneAborts times with no progress: the job fails.
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(absl::Seconds(61));
    jobs_.CheckStalls(absl::Seconds(60), JobManager::StallAction::kReplan);
  }
  st = jobs_.Status(job);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase, JobPhase::kFailed);
  EXPECT_THAT(st->message, HasSubstr("with no progress"));
  EXPECT_THAT(st->message, HasSubstr("all-reduce round 2 of step 1"));
  // A single node's stalled step fails the job at once, saying why.
  const std::string single = SubmitOn1Node(2);
  auto placed = jobs_.Status(single);
  ASSERT_TRUE(placed.ok() && placed->nodes.size() == 1);
  ASSERT_EQ(Plan(single, placed->nodes[0].node_id, 0).kind(),
            v1::PLAN_KIND_TRAIN);
  clock_.Advance(absl::Seconds(61));
  jobs_.CheckStalls(absl::Seconds(60), JobManager::StallAction::kReplan);
  st = jobs_.Status(single);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase, JobPhase::kFailed);
  EXPECT_THAT(st->message, HasSubstr("cannot be replanned"));
}

TEST_F(JobManagerTest, UpdateExchangeRefusesBadInput) {
  const std::string a = AddNode("a"), b = AddNode("b");
  const std::string sync_job = Submit(2);
  auto refused = Exchange(sync_job, a, 1, 0, 1.0f);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("max_clock_skew"));
  ASSERT_TRUE(jobs_.Cancel(sync_job, "next").ok());
  jobs_.NodesLost({}, "");
  // A fresh pair of nodes for the skewed job.
  const std::string c = AddNode("c"), d = AddNode("d");
  const std::string job = SubmitSkewed(2, 1);
  ASSERT_EQ(Plan(job, c, 0).kind(), v1::PLAN_KIND_TRAIN);
  v1::ExchangeUpdatesRequest r;
  r.set_job_id(job);
  r.mutable_update()->set_node_id(c);
  r.mutable_update()->set_step(1);
  r.mutable_update()->set_payload(std::string(4, '\0'));
  r.mutable_update()->set_crc32c(1);  // wrong
  EXPECT_EQ(rpc::ExchangeUpdates(jobs_, r, absl::Seconds(1)).status().code(),
            absl::StatusCode::kDataLoss);
  r.mutable_update()->set_payload("abc");  // not float32
  EXPECT_EQ(rpc::ExchangeUpdates(jobs_, r, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Exchange(job, c, 1, 0, 1.0f).ok());
  auto again = Exchange(job, c, 1, 0, 1.0f);  // (step, round) must grow
  EXPECT_EQ(again.status().code(), absl::StatusCode::kInvalidArgument);
  // An exchange waiting for the update of a node that is then lost ends
  // ABORTED: the job rolled back under it.
  ASSERT_TRUE(Finish(job, c, Plan(job, c, 1)).ok());
  ASSERT_EQ(Plan(job, c, 2).kind(), v1::PLAN_KIND_TRAIN);
  CondVarWaitWatch watch(jobs_);
  absl::StatusOr<std::vector<std::string>> waiting;
  std::thread tc([&] { waiting = Exchange(job, c, 2, 2, 1.0f); });
  const bool c_waits = watch.AwaitWaits(1, kBlockWithin);
  jobs_.NodesLost({d}, "test");
  tc.join();
  ASSERT_TRUE(c_waits) << "c's exchange never waited for d";
  EXPECT_EQ(waiting.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(waiting.status().message(), HasSubstr("rolled back"));
  auto st = jobs_.Status(job);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase, JobPhase::kRunning);
  // Calls of the rolled-back attempt are refused the same way.
  EXPECT_EQ(Exchange(job, c, 3, 2, 1.0f).status().code(),
            absl::StatusCode::kAborted);
}

// The typed entry points (what the in-process work client calls) run the
// same protocol as the wire ones: plans, a float64 round, typed metrics
// formatted to metrics.jsonl once, the end.
TEST_F(JobManagerTest, TypedCallsRunAStepAsTheWireOnesDo) {
  const std::string a = AddNode("a"), b = AddNode("b");
  const std::string job = Submit(1);
  // The job's WeightService bytes (the controller wires its WeightStore
  // here) are controller bytes of the job too; another job's are not.
  jobs_.SetWeightBytesSource(
      [job](const std::string& id) -> int64_t { return id == job ? 1000 : 7; });
  auto assigned = jobs_.GetAssignment(a, absl::ZeroDuration());
  ASSERT_TRUE(assigned.ok()) << assigned.status();
  EXPECT_EQ(assigned->job_id, job);
  EXPECT_THAT(assigned->card_indices, ::testing::ElementsAre(0));
  EXPECT_EQ(jobs_.GetAssignment(a, absl::Seconds(61)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto pa = jobs_.GetStepPlan(job, a, 0, 0, absl::ZeroDuration());
  auto pb = jobs_.GetStepPlan(job, b, 0, 0, absl::ZeroDuration());
  ASSERT_TRUE(pa.ok() && pb.ok());
  ASSERT_EQ(pa->kind, PlanKind::kTrain);
  EXPECT_EQ(pb->rank, 1);
  EXPECT_THAT(pa->groups, ::testing::ElementsAre(0, 1));
  EXPECT_THAT(pb->groups, ::testing::ElementsAre(2, 3));

  auto call = [&](const std::string& node, double value) {
    ReduceCall c;
    c.job_id = job;
    c.node_id = node;
    c.step = pa->step;
    c.attempt = pa->attempt;
    c.dtype = ReduceDtype::kFloat64;
    c.payload = std::string(reinterpret_cast<const char*>(&value), 8);
    return c;
  };
  absl::StatusOr<std::string> sum_b;
  std::thread tb([&] { sum_b = jobs_.Reduce(call(b, 2.25), kCallWait); });
  auto sum_a = jobs_.Reduce(call(a, 1.5), kCallWait);
  tb.join();
  ASSERT_TRUE(sum_a.ok() && sum_b.ok()) << sum_a.status() << sum_b.status();
  double got = 0;
  std::memcpy(&got, sum_a->data(), 8);
  EXPECT_EQ(got, 3.75);
  EXPECT_EQ(*sum_a, *sum_b);

  auto report = [&](const std::string& node, int64_t step, int attempt) {
    StepReport r;
    r.job_id = job;
    r.node_id = node;
    r.step = step;
    r.attempt = attempt;
    return r;
  };
  StepReport lead = report(a, pa->step, pa->attempt);
  lead.metrics = {{"step", 1}, {"kl", 0.5}};
  lead.rollout_tokens = 10;
  lead.loop_seconds = 4;
  absl::StatusOr<bool> done_b;
  std::thread fb([&] {
    done_b = jobs_.FinishStep(report(b, pb->step, pb->attempt), kCallWait);
  });
  auto done_a = jobs_.FinishStep(lead, kCallWait);
  fb.join();
  ASSERT_TRUE(done_a.ok() && done_b.ok());
  EXPECT_TRUE(*done_a);
  EXPECT_TRUE(*done_b);
  auto status = jobs_.Status(job);
  ASSERT_TRUE(status.ok());
  // tokens_per_second is the controller's: the run's 10 tokens in 4 s; so
  // is controller_tensor_bytes: 2 nodes x 8 bytes in and 8 bytes back, and
  // the job's 1000 weight bytes.
  EXPECT_EQ(status->last_metrics_json,
            "{\"step\":1,\"kl\":0.5,\"tokens_per_second\":2.5,"
            "\"controller_tensor_bytes\":1032}");
  EXPECT_EQ(ReadTextFile(out_ + "/metrics.jsonl", "metrics").value_or(""),
            "{\"step\":1,\"kl\":0.5,\"tokens_per_second\":2.5,"
            "\"controller_tensor_bytes\":1032}\n");
  EXPECT_EQ(status->controller_tensor_bytes, 1032);

  auto end = jobs_.GetStepPlan(job, a, 0, 2, absl::ZeroDuration());
  ASSERT_TRUE(end.ok());
  ASSERT_EQ(end->kind, PlanKind::kEnd);
  EXPECT_EQ(end->checkpoint_name, "final");
  ASSERT_TRUE(jobs_.FinishStep(report(a, end->step, 0), kCallWait).ok());
  status = jobs_.Status(job);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->phase, JobPhase::kSucceeded);
  EXPECT_EQ(status->rollout_tokens, 10);
  EXPECT_TRUE(std::filesystem::exists(out_ + "/summary.json"));
  EXPECT_EQ(jobs_.GetStepPlan(job, a, 0, 2, absl::ZeroDuration())->kind,
            PlanKind::kAbandon);
}

TEST_F(JobManagerTest, ATypedErrorReportFailsTheJobWithItsCode) {
  const std::string a = AddNode("a"), b = AddNode("b");
  const std::string job = Submit(2);
  auto pa = jobs_.GetStepPlan(job, a, 0, 0, absl::ZeroDuration());
  ASSERT_TRUE(pa.ok());
  StepReport r;
  r.job_id = job;
  r.node_id = a;
  r.step = pa->step;
  r.attempt = pa->attempt;
  r.error = absl::ResourceExhaustedError("out of memory");
  auto done = jobs_.FinishStep(r, kCallWait);
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(*done);
  auto status = jobs_.Status(job);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->phase, JobPhase::kFailed);
  EXPECT_THAT(status->message, HasSubstr("out of memory"));
  EXPECT_EQ(status->error_code,
            static_cast<int>(absl::StatusCode::kResourceExhausted));
}

// The outputs are created after the manager's lock is released; a job whose
// output_dir cannot be created fails with the reason before Submit returns.
TEST_F(JobManagerTest, AnOutputDirThatCannotBeCreatedFailsTheJob) {
  const std::string a = AddNode("a"), b = AddNode("b");
  const std::string file = ::testing::TempDir() + "/job-manager-not-a-dir";
  std::filesystem::remove_all(file);
  ASSERT_TRUE(WriteFileAtomic(file, "x").ok());
  v1::SubmitJobRequest r;
  r.set_config_yaml(JobYaml(file + "/out", 1));
  auto job = rpc::SubmitJob(jobs_, r);
  ASSERT_TRUE(job.ok()) << job.status();
  auto status = jobs_.Status(*job);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->phase, JobPhase::kFailed);
  EXPECT_THAT(status->message, HasSubstr("output_dir"));
  EXPECT_EQ(status->error_code,
            static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(jobs_.Idle());
  // Its nodes are free again: the next job is placed and runs.
  const std::string next = Submit(1);
  EXPECT_EQ(Plan(next, a, 0).kind(), v1::PLAN_KIND_TRAIN);
}

}  // namespace
}  // namespace fusionrl
