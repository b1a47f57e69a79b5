// The JobManager's wire edge: each plain struct survives its trip to the
// v1 message (and back, where the controller reads one), and the wire's
// derived fields are made from the plain ones.
#include "controller/job_manager_proto.h"

#include "gtest/gtest.h"

namespace fusionrl::rpc {
namespace {

TEST(JobManagerProtoTest, EveryPhaseAndRoleRoundTrips) {
  for (JobPhase p :
       {JobPhase::kPending, JobPhase::kWaitingForCapacity, JobPhase::kRunning,
        JobPhase::kSucceeded, JobPhase::kFailed, JobPhase::kCancelled}) {
    EXPECT_NE(JobPhaseToProto(p), v1::JOB_PHASE_UNSPECIFIED);
    EXPECT_EQ(JobPhaseFromProto(JobPhaseToProto(p)), p) << JobPhaseName(p);
  }
  // A journal record of a job that had not ended.
  EXPECT_EQ(JobPhaseFromProto(v1::JOB_PHASE_UNSPECIFIED), JobPhase::kPending);
  for (CardRole r : {CardRole::kIdle, CardRole::kColocated, CardRole::kFused,
                     CardRole::kRollout, CardRole::kTrain}) {
    EXPECT_NE(CardRoleToProto(r), v1::CARD_ROLE_UNSPECIFIED);
    EXPECT_EQ(CardRoleFromProto(CardRoleToProto(r)), r) << CardRoleName(r);
  }
}

TEST(JobManagerProtoTest, ACardReportRoundTrips) {
  CardReport c;
  c.index = 3;
  c.role = CardRole::kFused;
  c.busy_fraction = 0.75;
  c.memory_bytes = {{"weights", 1 << 20}, {"kv_cache", 4096}};
  c.activity = "all-reduce round 2 of step 41";
  c.activity_seconds = 95;
  EXPECT_EQ(CardReportFromProto(CardReportToProto(c)), c);
}

TEST(JobManagerProtoTest, TheFlatCardListIsMadeFromTheNodes) {
  JobStatus s;
  s.job_id = "job-7";
  s.phase = JobPhase::kRunning;
  s.submitted_at = absl::FromUnixMicros(1234567);
  for (const char* id : {"node-1", "node-2"}) {
    NodeStatus& n = s.nodes.emplace_back();
    n.node_id = id;
    n.state = "alive";
    n.heartbeat_age = absl::Milliseconds(250);
    for (int i = 0; i < 2; ++i) {
      CardReport& c = n.cards.emplace_back();
      c.index = i;
      c.role = CardRole::kColocated;
    }
  }
  s.events.push_back({absl::FromUnixMicros(42), "node-2 joined"});

  const v1::JobStatus p = JobStatusToProto(s);
  EXPECT_EQ(p.job_id(), "job-7");
  EXPECT_EQ(p.phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(p.submitted_at_us(), 1234567);
  ASSERT_EQ(p.nodes_size(), 2);
  EXPECT_EQ(p.nodes(1).heartbeat_age_ms(), 250);
  ASSERT_EQ(p.cards_size(), 4);
  EXPECT_EQ(p.cards(2).node_id(), "node-2");
  EXPECT_EQ(p.cards(2).state().index(), 0);
  EXPECT_EQ(p.cards(3).state().role(), v1::CARD_ROLE_COLOCATED);
  ASSERT_EQ(p.events_size(), 1);
  EXPECT_EQ(JobEventFromProto(p.events(0)), s.events[0]);
}

TEST(JobManagerProtoTest, HistoryKeepsItsRecordsAndWhereTheyBegin) {
  JobHistory h;
  h.first_seq = 5;
  HistoryRecord& r = h.records.emplace_back();
  r.seq = 5;
  r.step = 3;
  r.time = absl::FromUnixMicros(99);
  r.metrics_json = R"({"step":3})";
  r.checkpoint_dir = "/out/checkpoints/step_3";
  const v1::JobHistory p = JobHistoryToProto(h);
  EXPECT_EQ(p.first_seq(), 5);
  ASSERT_EQ(p.records_size(), 1);
  EXPECT_EQ(p.records(0).step(), 3);
  EXPECT_EQ(p.records(0).time_us(), 99);
  EXPECT_EQ(p.records(0).metrics_json(), r.metrics_json);
  EXPECT_EQ(p.records(0).eval_accuracy(), -1);
  EXPECT_EQ(p.records(0).checkpoint_dir(), r.checkpoint_dir);
}

}  // namespace
}  // namespace fusionrl::rpc
