// The controller's HTTP endpoints on a real server: /metrics parsed line by
// line against the Prometheus text format, /api/status as JSON, the token,
// and the pure exporters on hand-made statuses.
#include "controller/outputs/http_server.h"

#include <grpcpp/create_channel.h>
#include <httplib.h>

#include <regex>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "controller/controller.h"
#include "controller/outputs/status_export.h"
#include "fusionrl/v1/job.grpc.pb.h"
#include "fusionrl/v1/node.grpc.pb.h"
#include "fusionrl/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace {

using ::testing::HasSubstr;

// Checks `text` against the exposition format 0.0.4: every line is a HELP,
// a TYPE or a sample; each family has one HELP and one TYPE before its
// samples; samples belong to the family declared last (histograms add
// _bucket/_sum/_count); label values are quoted and escaped; values parse.
// Returns the families seen, or fails the test.
std::set<std::string> CheckExposition(const std::string& text) {
  static const std::regex kHelp(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) \S.*)");
  static const std::regex kType(
      R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram))");
  static const std::regex kSample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\\\|\\"|\\n)*")(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\\\|\\"|\\n)*")*\})? (NaN|[+-]Inf|[-+]?[0-9.]+([eE][-+]?[0-9]+)?))");
  std::set<std::string> families;
  std::string family, type;
  bool help_seen = false;
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  int n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++n;
    if (line.empty()) continue;
    std::smatch m;
    const std::string l(line);
    if (std::regex_match(l, m, kHelp)) {
      family = m[1];
      EXPECT_TRUE(families.insert(family).second)
          << "line " << n << ": family " << family << " declared twice";
      help_seen = true;
      type.clear();
    } else if (std::regex_match(l, m, kType)) {
      EXPECT_TRUE(help_seen && m[1] == family)
          << "line " << n << ": TYPE without its HELP: " << l;
      type = m[2];
    } else if (std::regex_match(l, m, kSample)) {
      const std::string name = m[1];
      EXPECT_FALSE(type.empty()) << "line " << n << ": sample before TYPE";
      if (type == "histogram") {
        EXPECT_TRUE(name == family + "_bucket" || name == family + "_sum" ||
                    name == family + "_count")
            << "line " << n << ": " << l;
      } else {
        EXPECT_EQ(name, family) << "line " << n << ": " << l;
      }
      if (type == "counter") {
        EXPECT_TRUE(absl::EndsWith(family, "_total")) << family;
      }
    } else {
      ADD_FAILURE() << "line " << n << " is not in the text format: " << l;
    }
  }
  return families;
}

v1::ClusterStatus HandMadeStatus() {
  v1::ClusterStatus s;
  s.set_version("9.9.9");
  s.set_uptime_seconds(12.5);
  v1::NodeStatus* n = s.add_nodes();
  n->set_node_id("node-1");
  n->set_host("host \"a\"\\b\nc");  // every character that needs escaping
  n->set_super_node("sn-0");
  n->set_state("alive");
  n->set_heartbeat_age_ms(1500);
  v1::CardState* c = n->add_cards();
  c->set_index(0);
  c->set_role(v1::CARD_ROLE_FUSED);
  c->set_busy_fraction(0.75);
  (*c->mutable_memory_bytes())["weights"] = 1024;
  (*c->mutable_memory_bytes())["kv_cache"] = 2048;
  v1::JobStatus* j = s.add_jobs();
  j->set_job_id("job-1");
  j->set_name("t");
  j->set_phase(v1::JOB_PHASE_RUNNING);
  j->set_step(3);
  j->set_total_steps(10);
  j->set_max_clock_skew(1);
  j->set_last_metrics_json(R"({"step":3,"max_staleness":2})");
  *j->add_nodes() = *n;
  return s;
}

TEST(StatusExportTest, PrometheusTextIsWellFormedAndCarriesTheFigures) {
  RpcStats stats;
  stats.Record("/fusionrl.v1.JobService/GetJobStatus", 0,
               absl::Milliseconds(3));
  stats.Record("/fusionrl.v1.JobService/GetJobStatus", 5,
               absl::Milliseconds(40));
  const std::string text = PrometheusText(HandMadeStatus(), stats.Get());
  const std::set<std::string> families = CheckExposition(text);
  for (const char* f :
       {"fusionrl_build_info", "fusionrl_job_phase", "fusionrl_job_step",
        "fusionrl_job_max_staleness", "fusionrl_card_busy_fraction",
        "fusionrl_card_memory_bytes", "fusionrl_node_heartbeat_age_seconds",
        "fusionrl_node_clock", "fusionrl_rpc_requests_total",
        "fusionrl_rpc_latency_seconds", "fusionrl_job_groups_trained_total"}) {
    EXPECT_TRUE(families.count(f)) << f;
  }
  EXPECT_THAT(text, HasSubstr("host=\"host \\\"a\\\"\\\\b\\nc\""));
  EXPECT_THAT(text, HasSubstr("fusionrl_card_busy_fraction{node=\"node-1\","
                              "card=\"0\",role=\"fused\"} "
                              "0.75\n"));
  EXPECT_THAT(text, HasSubstr("fusionrl_job_phase{job=\"job-1\",phase="
                              "\"running\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("fusionrl_job_phase{job=\"job-1\",phase="
                              "\"failed\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("fusionrl_job_max_staleness{job=\"job-1\"} 2\n"));
  // Cumulative buckets: 3 ms falls in le=0.005, 40 ms in le=0.05.
  const std::string m = "method=\"/fusionrl.v1.JobService/GetJobStatus\"";
  EXPECT_THAT(text, HasSubstr("fusionrl_rpc_latency_seconds_bucket{" + m +
                              ",le=\"0.0025000000000000001\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("fusionrl_rpc_latency_seconds_bucket{" + m +
                              ",le=\"0.0050000000000000001\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("fusionrl_rpc_latency_seconds_bucket{" + m +
                              ",le=\"+Inf\"} 2\n"));
  EXPECT_THAT(text,
              HasSubstr("fusionrl_rpc_latency_seconds_count{" + m + "} 2\n"));
  EXPECT_THAT(text, HasSubstr("fusionrl_rpc_requests_total{" + m +
                              ",code=\"NOT_FOUND\"} 1\n"));
}

TEST(StatusExportTest, CurvesFoldRecordsAndDropRolledBackSteps) {
  auto record = [](int64_t seq, int64_t step, double reward, double eval) {
    v1::StepRecord r;
    r.set_seq(seq);
    r.set_step(step);
    r.set_eval_accuracy(eval);
    if (step > 0) {
      r.set_metrics_json(
          absl::StrCat(R"({"step":)", step, R"(,"reward_mean":)", reward, "}"));
    }
    return r;
  };
  JobCurves c;
  v1::JobHistory h;
  *h.add_records() = record(1, 0, 0, 0.1);
  *h.add_records() = record(2, 1, 0.2, -1);
  *h.add_records() = record(3, 2, 0.3, 0.4);
  *h.add_records() = record(4, 3, 0.5, -1);
  c.Add(h);
  EXPECT_EQ(c.step, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(c.eval_step, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(c.last_seq, 4);
  c.Add(h);  // seen records are skipped
  EXPECT_EQ(c.step.size(), 3u);
  v1::JobHistory again;  // a roll-back to step 1 replays step 2
  *again.add_records() = record(5, 2, 0.9, -1);
  c.Add(again);
  EXPECT_EQ(c.step, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(c.reward_mean, (std::vector<double>{0.2, 0.9}));
  EXPECT_TRUE(std::isnan(c.max_staleness[0]));  // absent: NaN, null in JSON
  const nlohmann::json j = nlohmann::json::parse(
      StatusJson(HandMadeStatus(), {{"job-1", c}}, "127.0.0.1:1"));
  EXPECT_EQ(j["jobs"][0]["history"]["step"], nlohmann::json({1, 2}));
  EXPECT_TRUE(j["jobs"][0]["history"]["max_staleness"][0].is_null());
  EXPECT_EQ(j["nodes"][0]["cards"][0]["role"], "fused");
  EXPECT_EQ(j["jobs"][0]["clocks"].size(), 1u);
  EXPECT_EQ(j["super_nodes"][0]["cards"], 1);
}

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(const std::string& token) {
    ControllerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.http_address = "127.0.0.1:0";
    options.auth_token = token;
    auto c = Controller::Start(options);
    ASSERT_TRUE(c.ok()) << c.status();
    controller_ = *std::move(c);
    ASSERT_GT(controller_->http_port(), 0);
    client_ = std::make_unique<httplib::Client>("127.0.0.1",
                                                controller_->http_port());
    client_->set_connection_timeout(10);
    client_->set_read_timeout(10);
  }
  // A node with two idle cards, registered over gRPC as a worker does.
  void RegisterNode(const std::string& token) {
    auto nodes = v1::NodeService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", controller_->port()),
                            grpc::InsecureChannelCredentials()));
    v1::RegisterNodeRequest req;
    req.set_host("box");
    req.set_super_node("sn-7");
    req.set_version("0.0.1-test");
    for (int i = 0; i < 2; ++i) {
      v1::Card* card = req.add_cards();
      card->set_index(i);
      card->set_device("cpu");
    }
    v1::RegisterNodeResponse resp;
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    ASSERT_TRUE(nodes->RegisterNode(&ctx, req, &resp).ok());
  }
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(HttpServerTest, ServesTheClusterWithoutJobs) {
  Start("");
  RegisterNode("");
  auto status = client_->Get("/api/status");
  ASSERT_TRUE(status);
  EXPECT_EQ(status->status, 200);
  const nlohmann::json j = nlohmann::json::parse(status->body);
  EXPECT_EQ(j["controller"]["version"], FUSIONRL_VERSION);
  ASSERT_EQ(j["nodes"].size(), 1u);
  EXPECT_EQ(j["nodes"][0]["super_node"], "sn-7");
  EXPECT_EQ(j["nodes"][0]["version"], "0.0.1-test");
  ASSERT_EQ(j["nodes"][0]["cards"].size(), 2u);
  EXPECT_EQ(j["nodes"][0]["cards"][1]["role"], "idle");
  EXPECT_EQ(j["nodes"][0]["cards"][1]["device"], "cpu");
  EXPECT_TRUE(j["jobs"].empty());

  auto metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->get_header_value("Content-Type"),
              HasSubstr("text/plain; version=0.0.4"));
  const std::set<std::string> families = CheckExposition(metrics->body);
  EXPECT_TRUE(families.count("fusionrl_rpc_requests_total"));
  // The RegisterNode call above, counted by the interceptor.
  EXPECT_THAT(metrics->body,
              HasSubstr("fusionrl_rpc_requests_total{method=\"/fusionrl.v1."
                        "NodeService/RegisterNode\",code=\"OK\"} 1\n"));
  EXPECT_THAT(metrics->body, HasSubstr("fusionrl_nodes{state=\"alive\"} 1\n"));

  auto page = client_->Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_THAT(page->body, HasSubstr("api/status"));
  EXPECT_EQ(page->body.find("http://"), std::string::npos)
      << "the dashboard must not load anything from the network";
  EXPECT_EQ(page->body.find("https://"), std::string::npos);
  auto missing = client_->Get("/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

TEST_F(HttpServerTest, TheTokenProtectsEverythingButHealth) {
  Start("tok-123");
  for (const char* path : {"/", "/api/status", "/metrics"}) {
    auto r = client_->Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 401) << path;
    EXPECT_THAT(r->body, HasSubstr("shared token")) << path;
    auto wrong = client_->Get(path, {{"Authorization", "Bearer tok-12"}});
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 401) << path;
    auto header = client_->Get(path, {{"Authorization", "Bearer tok-123"}});
    ASSERT_TRUE(header);
    EXPECT_EQ(header->status, 200) << path;
    auto query = client_->Get(absl::StrCat(path, "?token=tok-123"));
    ASSERT_TRUE(query);
    EXPECT_EQ(query->status, 200) << path;
  }
  auto health = client_->Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST(HttpServerStartTest, BadAddressesAreNamed) {
  ControllerOptions options;
  options.http_address = "no-port";
  auto c = Controller::Start(options);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("no-port"));
  options.http_address = "127.0.0.1:0";
  auto first = Controller::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  options.http_address = absl::StrCat("127.0.0.1:", (*first)->http_port());
  auto second = Controller::Start(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace fusionrl
