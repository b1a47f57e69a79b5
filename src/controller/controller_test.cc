// The controller's services through a real server on 127.0.0.1:0: every bad
// request gets its status code, every call without the shared token gets
// UNAUTHENTICATED, health checking answers without it.
#include "controller/controller.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/fake_clock.h"
#include "fusionrl/v1/job.grpc.pb.h"
#include "fusionrl/v1/node.grpc.pb.h"
#include "fusionrl/v1/weight.grpc.pb.h"
#include "fusionrl/v1/work.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "s3cret-token";

constexpr char kJob[] = R"(name: t
num_threads: 1
model: {d_model: 32, n_layers: 1, n_heads: 2, d_ff: 64, max_seq_len: 24}
task: {name: reverse, eval_size: 10, min_digits: 1, max_digits: 3}
rollout: {prompts_per_step: 4, group_size: 2, max_new_tokens: 5}
run: {total_steps: 2}
placement: {super_nodes: 1, cards_per_super_node: 1}
)";

class ControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ControllerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.auth_token = kToken;
    auto c = Controller::Start(options);
    ASSERT_TRUE(c.ok()) << c.status();
    controller_ = *std::move(c);
    channel_ =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", controller_->port()),
                            grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel_);
    nodes_ = v1::NodeService::NewStub(channel_);
    work_ = v1::WorkService::NewStub(channel_);
    weights_ = v1::WeightService::NewStub(channel_);
  }

  // A context with the right token (or `token`), 10 s deadline.
  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token = kToken) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(10));
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }

  std::string RegisterNode(const std::string& super_node) {
    v1::RegisterNodeRequest r;
    r.set_host("h");
    r.set_super_node(super_node);
    v1::Card* card = r.add_cards();
    card->set_index(0);
    card->set_device("cpu");
    v1::RegisterNodeResponse out;
    grpc::Status st = nodes_->RegisterNode(Ctx().get(), r, &out);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return out.node_id();
  }

  std::string Submit() {
    v1::SubmitJobRequest r;
    r.set_config_yaml(kJob);
    r.set_source_name("job.yaml");
    r.add_overrides(absl::StrCat("output_dir=\"", ::testing::TempDir(),
                                 "/controller-test\""));
    v1::SubmitJobResponse out;
    grpc::Status st = jobs_->SubmitJob(Ctx().get(), r, &out);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return out.job_id();
  }

  std::unique_ptr<Controller> controller_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::NodeService::Stub> nodes_;
  std::unique_ptr<v1::WorkService::Stub> work_;
  std::unique_ptr<v1::WeightService::Stub> weights_;
};

TEST_F(ControllerTest, EveryServiceRefusesCallsWithoutTheToken) {
  for (const std::string& token : {std::string(), std::string("wrong")}) {
    v1::ListJobsResponse list;
    EXPECT_EQ(jobs_->ListJobs(Ctx(token).get(), {}, &list).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::SubmitJobRequest submit;
    submit.set_config_yaml(kJob);
    v1::SubmitJobResponse submitted;
    EXPECT_EQ(
        jobs_->SubmitJob(Ctx(token).get(), submit, &submitted).error_code(),
        grpc::StatusCode::UNAUTHENTICATED);
    v1::RegisterNodeRequest reg;
    reg.set_super_node("a");
    reg.add_cards()->set_index(0);
    v1::RegisterNodeResponse registered;
    EXPECT_EQ(
        nodes_->RegisterNode(Ctx(token).get(), reg, &registered).error_code(),
        grpc::StatusCode::UNAUTHENTICATED);
    v1::GetAssignmentRequest assign;
    assign.set_node_id("node-1");
    v1::GetAssignmentResponse assignment;
    EXPECT_EQ(work_->GetAssignment(Ctx(token).get(), assign, &assignment)
                  .error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::FetchWeightsRequest fetch;
    fetch.set_job_id("job-1");
    auto fetch_ctx = Ctx(token);
    auto reader = weights_->FetchWeights(fetch_ctx.get(), fetch);
    v1::WeightChunk chunk;
    while (reader->Read(&chunk)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // Nothing was registered or submitted by the refused calls.
  EXPECT_EQ(controller_->registry().alive_count(), 0);
  EXPECT_TRUE(controller_->jobs().List().empty());
}

TEST_F(ControllerTest, HealthCheckingAnswersWithoutTheToken) {
  grpc::GenericStub stub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice empty("", 0);
  grpc::ByteBuffer request(&empty, 1);  // HealthCheckRequest{service: ""}
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request, &response,
                 [&done](grpc::Status st) { done.set_value(st); });
  grpc::Status st = done.get_future().get();
  ASSERT_TRUE(st.ok()) << st.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // status: SERVING
}

TEST_F(ControllerTest, SubmitJobValidatesTheJob) {
  v1::SubmitJobResponse out;
  v1::SubmitJobRequest r;
  grpc::Status st = jobs_->SubmitJob(Ctx().get(), r, &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("config_yaml"));

  r.set_config_yaml(std::string(kJob) + "rollout_typo: 1\n");
  r.set_source_name("job.yaml");
  st = jobs_->SubmitJob(Ctx().get(), r, &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("job.yaml"));
  EXPECT_THAT(st.error_message(), HasSubstr("rollout_typo"));

  r.set_config_yaml(kJob);
  r.add_overrides("placement.mode=disaggregated");
  r.add_overrides("placement.cards_per_super_node=4");  // 3 training cards
  r.add_overrides("placement.rollout_cards_per_super_node=1");
  st = jobs_->SubmitJob(Ctx().get(), r, &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), HasSubstr("training cards"));

  r.clear_overrides();
  r.add_overrides("placement.cards_per_super_node=3");  // 4 groups, 3 cards
  st = jobs_->SubmitJob(Ctx().get(), r, &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), HasSubstr("rollout.prompts_per_step"));

  r.clear_overrides();
  r.add_overrides("output_dir=\"/nonexistent/fusionrl-test\"");
  r.set_resume(true);
  st = jobs_->SubmitJob(Ctx().get(), r, &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(st.error_message(), HasSubstr("no checkpoints"));
  EXPECT_TRUE(controller_->jobs().List().empty());
}

TEST_F(ControllerTest, JobCallsCheckIdsAndRanges) {
  v1::JobStatus status;
  v1::GetJobStatusRequest get;
  EXPECT_EQ(jobs_->GetJobStatus(Ctx().get(), get, &status).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  get.set_job_id("job-42");
  EXPECT_EQ(jobs_->GetJobStatus(Ctx().get(), get, &status).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::CancelJobRequest cancel;
  cancel.set_job_id("job-42");
  EXPECT_EQ(jobs_->CancelJob(Ctx().get(), cancel, &status).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::WatchJobRequest watch;
  watch.set_job_id("job-1");
  watch.set_min_interval_ms(-1);
  auto watch_ctx = Ctx();
  auto reader = jobs_->WatchJob(watch_ctx.get(), watch);
  while (reader->Read(&status)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ControllerTest, AJobWithoutCapacityWaitsWithTheReasonAndCancels) {
  const std::string id = Submit();
  v1::GetJobStatusRequest get;
  get.set_job_id(id);
  v1::JobStatus status;
  ASSERT_TRUE(jobs_->GetJobStatus(Ctx().get(), get, &status).ok());
  EXPECT_EQ(status.phase(), v1::JOB_PHASE_WAITING_FOR_CAPACITY);
  EXPECT_THAT(status.message(), HasSubstr("needs 1 super node"));
  v1::CancelJobRequest cancel;
  cancel.set_job_id(id);
  ASSERT_TRUE(jobs_->CancelJob(Ctx().get(), cancel, &status).ok());
  EXPECT_EQ(status.phase(), v1::JOB_PHASE_CANCELLED);
  // Cancelling twice is refused.
  EXPECT_EQ(jobs_->CancelJob(Ctx().get(), cancel, &status).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(ControllerTest, WorkCallsRefuseUnknownNodesOutsidersAndBadPayloads) {
  v1::GetAssignmentRequest assign;
  assign.set_node_id("node-9");
  v1::GetAssignmentResponse assignment;
  EXPECT_EQ(work_->GetAssignment(Ctx().get(), assign, &assignment).error_code(),
            grpc::StatusCode::NOT_FOUND);
  const std::string member = RegisterNode("a");
  assign.set_node_id(member);
  assign.set_wait_ms(600000);
  EXPECT_EQ(work_->GetAssignment(Ctx().get(), assign, &assignment).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  const std::string id = Submit();  // placed on `member` at once
  assign.set_wait_ms(1000);
  ASSERT_TRUE(work_->GetAssignment(Ctx().get(), assign, &assignment).ok());
  EXPECT_EQ(assignment.job_id(), id);
  const std::string outsider = RegisterNode("b");

  v1::GetStepPlanRequest plan;
  plan.set_job_id(id);
  plan.set_node_id(outsider);
  v1::StepPlan step;
  EXPECT_EQ(work_->GetStepPlan(Ctx().get(), plan, &step).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  plan.set_node_id(member);
  plan.set_local_rank(1);  // the node runs the job on one card
  EXPECT_EQ(work_->GetStepPlan(Ctx().get(), plan, &step).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  plan.set_local_rank(0);
  ASSERT_TRUE(work_->GetStepPlan(Ctx().get(), plan, &step).ok());
  EXPECT_EQ(step.kind(), v1::PLAN_KIND_TRAIN);
  EXPECT_EQ(step.groups_size(), 4);

  v1::ReduceRequest reduce;
  reduce.set_job_id(id);
  reduce.set_node_id(member);
  reduce.set_step(step.step());
  reduce.set_attempt(step.attempt());
  reduce.set_payload(std::string(6, '\0'));
  v1::ReduceResponse sum;
  EXPECT_EQ(work_->Reduce(Ctx().get(), reduce, &sum).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);  // no dtype
  reduce.set_dtype(v1::REDUCE_DTYPE_FLOAT32);
  EXPECT_EQ(work_->Reduce(Ctx().get(), reduce, &sum).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);  // 6 bytes of float32
  reduce.set_payload(std::string(8, '\0'));
  reduce.set_attempt(step.attempt() + 1);
  EXPECT_EQ(work_->Reduce(Ctx().get(), reduce, &sum).error_code(),
            grpc::StatusCode::ABORTED);  // not the current attempt
  reduce.set_attempt(step.attempt());
  // A node alone in its attempt gets its own payload back.
  ASSERT_TRUE(work_->Reduce(Ctx().get(), reduce, &sum).ok());
  EXPECT_EQ(sum.payload(), std::string(8, '\0'));
  reduce.set_node_id(outsider);
  EXPECT_EQ(work_->Reduce(Ctx().get(), reduce, &sum).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

}  // namespace
}  // namespace fusionrl

namespace fusionrl {
namespace {

// TLS with a self-signed certificate made by the openssl tool.
TEST(ControllerTlsTest, ServesTlsOnlyWithCertificateAndKey) {
  const std::string dir = ::testing::TempDir() + "/controller-tls";
  std::filesystem::create_directories(dir);
  const std::string cmd = absl::StrCat(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=DNS:localhost -keyout ",
      dir, "/key.pem -out ", dir, "/cert.pem >/dev/null 2>&1");
  if (std::system(cmd.c_str()) != 0) {
    GTEST_SKIP() << "the openssl tool is not available";
  }
  ControllerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.tls_cert_file = dir + "/cert.pem";
  options.tls_key_file = dir + "/key.pem";
  auto controller = Controller::Start(options);
  ASSERT_TRUE(controller.ok()) << controller.status();
  const std::string address = absl::StrCat("localhost:", (*controller)->port());

  std::ifstream in(dir + "/cert.pem");
  std::stringstream pem;
  pem << in.rdbuf();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = pem.str();
  auto secure = v1::JobService::NewStub(
      grpc::CreateChannel(address, grpc::SslCredentials(ssl)));
  v1::ListJobsResponse list;
  grpc::ClientContext ok_ctx;
  ok_ctx.set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(10));
  grpc::Status st = secure->ListJobs(&ok_ctx, {}, &list);
  EXPECT_TRUE(st.ok()) << st.error_message();

  auto plain = v1::JobService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext plain_ctx;
  plain_ctx.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(3));
  EXPECT_FALSE(plain->ListJobs(&plain_ctx, {}, &list).ok());

  options.tls_key_file.clear();  // half a TLS configuration
  EXPECT_EQ(Controller::Start(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ControllerOptions::clock is the controller's time source: the status's
// time and uptime follow it, not the wall clock.
TEST(ControllerClockTest, StatusFollowsTheGivenClock) {
  FakeClock clock(absl::FromUnixSeconds(1000000));
  ControllerOptions options;
  options.clock = &clock;
  auto c = Controller::Start(options);
  ASSERT_TRUE(c.ok()) << c.status();
  v1::ClusterStatus s = (*c)->ClusterStatus();
  EXPECT_EQ(s.time_us(), int64_t{1000000} * 1000000);
  EXPECT_EQ(s.uptime_seconds(), 0);
  clock.Advance(absl::Seconds(90));
  s = (*c)->ClusterStatus();
  EXPECT_EQ(s.time_us(), int64_t{1000090} * 1000000);
  EXPECT_EQ(s.uptime_seconds(), 90);
}

}  // namespace
}  // namespace fusionrl
