// env.name remote against fake EnvironmentService servers in this process,
// on loopback ports picked by the OS: an episode's round trip, deadlines, a
// server killed mid-episode and restarted, invalid answers, addresses.
#include "rpc/remote_environment.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "fusionrl/environment.h"
#include "fusionrl/v1/environment.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl::rpc {
namespace {

namespace pb = fusionrl::v1;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Optional;
using ::testing::Pair;

absl::Time Deadline(absl::Duration d = absl::Seconds(10)) {
  return absl::Now() + d;
}

// A calculator-like environment whose misbehaviour the tests choose.
class FakeService final : public pb::EnvironmentService::Service {
 public:
  // Step answers hang (until the call is cancelled) from now on.
  std::atomic<bool> hang_step{false};
  // Open answers an empty episode_id / a message with role "robot".
  std::atomic<bool> empty_episode_id{false};
  std::atomic<bool> bad_role{false};
  // Step answers a NaN reward.
  std::atomic<bool> nan_reward{false};

  grpc::Status Open(grpc::ServerContext*, const pb::OpenEpisodeRequest* request,
                    pb::OpenEpisodeResponse* response) override {
    absl::MutexLock lock(&mu_);
    opens_.push_back(*request);
    std::string id = empty_episode_id ? "" : absl::StrCat("ep-", next_id_++);
    if (!id.empty()) open_[id] = request->problem().answer();
    response->set_episode_id(id);
    if (bad_role) {
      pb::EnvMessage* m = response->add_messages();
      m->set_role("robot");
      m->set_content("beep");
    }
    pb::EnvTool* calc = response->add_tools();
    calc->set_name("calc");
    calc->set_description("Evaluates integer arithmetic");
    calc->set_parameters_json(R"({"type":"object"})");
    pb::EnvTool* broken = response->add_tools();
    broken->set_name("broken");
    broken->set_parameters_json("{not json");
    pb::EnvTool* bare = response->add_tools();
    bare->set_name("bare");  // no parameters_json: "{}"
    return grpc::Status::OK;
  }

  grpc::Status Step(grpc::ServerContext* context,
                    const pb::StepEpisodeRequest* request,
                    pb::StepEpisodeResponse* response) override {
    if (hang_step) {
      // Never answers; returns once the client's deadline has passed (the
      // server sees it too) so that the server can shut down.
      while (!context->IsCancelled()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return grpc::Status(grpc::StatusCode::CANCELLED, "hung");
    }
    absl::MutexLock lock(&mu_);
    steps_.push_back(*request);
    auto it = open_.find(request->episode_id());
    if (it == open_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "no episode " + request->episode_id());
    }
    pb::EnvObservation* o = response->mutable_observation();
    const pb::EnvAssistantTurn& turn = request->turn();
    if (turn.tool_calls_size() > 0) {
      for (const pb::EnvToolCall& call : turn.tool_calls()) {
        pb::EnvMessage* m = o->add_messages();
        m->set_role("tool");
        m->set_content("result of " + call.arguments_json());
      }
      (*o->mutable_metrics())["calc_calls"] = turn.tool_calls_size();
      return grpc::Status::OK;
    }
    o->set_done(true);
    const bool correct = turn.content() == it->second;
    o->set_reward(nan_reward ? std::nan("") : (correct ? 1.0 : 0.0));
    o->set_correct(correct);
    return grpc::Status::OK;
  }

  // A truncated Close answers this verdict (a cut episode's reward).
  grpc::Status Close(grpc::ServerContext*,
                     const pb::CloseEpisodeRequest* request,
                     pb::CloseEpisodeResponse* response) override {
    absl::MutexLock lock(&mu_);
    closed_.push_back(request->episode_id());
    close_requests_.push_back(*request);
    if (request->truncated()) {
      response->set_reward(-0.75);
      (*response->mutable_metrics())["cut"] = 1;
    }
    if (open_.erase(request->episode_id()) == 0) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "no episode " + request->episode_id());
    }
    return grpc::Status::OK;
  }

  std::vector<pb::OpenEpisodeRequest> opens() {
    absl::MutexLock lock(&mu_);
    return opens_;
  }
  std::vector<pb::StepEpisodeRequest> steps() {
    absl::MutexLock lock(&mu_);
    return steps_;
  }
  std::vector<std::string> closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
  }
  std::vector<pb::CloseEpisodeRequest> close_requests() {
    absl::MutexLock lock(&mu_);
    return close_requests_;
  }

 private:
  absl::Mutex mu_;
  int next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::string> open_ ABSL_GUARDED_BY(mu_);  // id->answer
  std::vector<pb::OpenEpisodeRequest> opens_ ABSL_GUARDED_BY(mu_);
  std::vector<pb::StepEpisodeRequest> steps_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> closed_ ABSL_GUARDED_BY(mu_);
  std::vector<pb::CloseEpisodeRequest> close_requests_ ABSL_GUARDED_BY(mu_);
};

// A FakeService served on 127.0.0.1:`port` (0 = a free port).
class FakeServer {
 public:
  explicit FakeServer(int port = 0) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port),
                             grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    EXPECT_GT(port_, 0) << "cannot listen on 127.0.0.1:" << port;
  }
  ~FakeServer() { Stop(); }

  // Shuts the server down (cancelling calls in flight), as a killed
  // server's connections go away.
  void Stop() {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
  }

  FakeService& service() { return service_; }
  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  FakeService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

std::unique_ptr<Environment> MakeEnv(const std::string& address) {
  EnvConfig config;
  config.name = "remote";
  config.address = address;
  absl::StatusOr<std::unique_ptr<Environment>> env =
      MakeRemoteEnvironment(config);
  EXPECT_TRUE(env.ok()) << env.status();
  return env.ok() ? std::move(*env) : nullptr;
}

Problem TestProblem() {
  Problem problem{"What is 347*29?", "10063"};
  problem.system = "Use the calculator.";
  problem.messages = {{"system", "Use the calculator."},
                      {"user", "What is 347*29?"}};
  problem.solution = "347*29 = 10063";
  return problem;
}

AssistantTurn CallTurn() {
  AssistantTurn turn;
  turn.index = 0;
  turn.text = R"(<tool_call>{"name": "calc"}</tool_call>)";
  turn.content = "";
  turn.tool_calls = {{"calc", R"({"expression":"347*29"})"}};
  turn.call_errors = {"tool call 2: no tool named 'search'"};
  turn.truncated = true;
  return turn;
}

AssistantTurn AnswerTurn(const std::string& answer) {
  AssistantTurn turn;
  turn.index = 1;
  turn.text = answer;
  turn.content = answer;
  return turn;
}

TEST(RemoteEnvironmentTest, EpisodeRoundTrip) {
  FakeServer server;
  std::unique_ptr<Environment> env = MakeEnv(server.address());
  ASSERT_NE(env, nullptr);

  EpisodeStart start;
  absl::StatusOr<std::unique_ptr<Episode>> episode =
      env->Open(TestProblem(), 12345, Deadline(), &start);
  ASSERT_TRUE(episode.ok()) << episode.status();
  EXPECT_THAT(start.messages, IsEmpty());
  ASSERT_EQ(start.tools.size(), 3u);
  EXPECT_EQ(start.tools[0].name, "calc");
  EXPECT_EQ(start.tools[0].description, "Evaluates integer arithmetic");
  EXPECT_EQ(start.tools[0].parameters_json, R"({"type":"object"})");
  EXPECT_EQ(start.tools[1].parameters_json, "{not json");  // kept as text
  EXPECT_EQ(start.tools[2].parameters_json, "{}");

  ASSERT_EQ(server.service().opens().size(), 1u);
  const pb::OpenEpisodeRequest open = server.service().opens()[0];
  EXPECT_EQ(open.seed(), 12345u);
  EXPECT_EQ(open.problem().prompt(), "What is 347*29?");
  EXPECT_EQ(open.problem().answer(), "10063");
  EXPECT_EQ(open.problem().system(), "Use the calculator.");
  EXPECT_EQ(open.problem().solution(), "347*29 = 10063");
  ASSERT_EQ(open.problem().messages_size(), 2);
  EXPECT_EQ(open.problem().messages(1).role(), "user");
  EXPECT_EQ(open.problem().messages(1).content(), "What is 347*29?");

  absl::StatusOr<Observation> tool = (*episode)->Step(CallTurn(), Deadline());
  ASSERT_TRUE(tool.ok()) << tool.status();
  ASSERT_EQ(tool->messages.size(), 1u);
  EXPECT_EQ(tool->messages[0].role, "tool");
  EXPECT_EQ(tool->messages[0].content, R"(result of {"expression":"347*29"})");
  EXPECT_FALSE(tool->done);
  EXPECT_EQ(tool->reward, std::nullopt);
  EXPECT_EQ(tool->correct, std::nullopt);
  EXPECT_THAT(tool->metrics, ElementsAre(Pair("calc_calls", 1.0)));

  const pb::StepEpisodeRequest sent = server.service().steps()[0];
  EXPECT_EQ(sent.episode_id(), "ep-0");
  EXPECT_EQ(sent.turn().index(), 0);
  EXPECT_EQ(sent.turn().text(), CallTurn().text);
  EXPECT_EQ(sent.turn().content(), "");
  ASSERT_EQ(sent.turn().tool_calls_size(), 1);
  EXPECT_EQ(sent.turn().tool_calls(0).name(), "calc");
  EXPECT_EQ(sent.turn().tool_calls(0).arguments_json(),
            R"({"expression":"347*29"})");
  ASSERT_EQ(sent.turn().call_errors_size(), 1);
  EXPECT_EQ(sent.turn().call_errors(0), "tool call 2: no tool named 'search'");
  EXPECT_TRUE(sent.turn().truncated());

  absl::StatusOr<Observation> final_answer =
      (*episode)->Step(AnswerTurn("10063"), Deadline());
  ASSERT_TRUE(final_answer.ok()) << final_answer.status();
  EXPECT_TRUE(final_answer->done);
  EXPECT_THAT(final_answer->messages, IsEmpty());
  EXPECT_THAT(final_answer->reward, Optional(1.0));
  EXPECT_THAT(final_answer->correct, Optional(true));

  // A reward of 0 and correct=false are values, not absences.
  absl::StatusOr<std::unique_ptr<Episode>> wrong =
      env->Open(TestProblem(), 1, Deadline(), nullptr);
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  absl::StatusOr<Observation> graded =
      (*wrong)->Step(AnswerTurn("10062"), Deadline());
  ASSERT_TRUE(graded.ok()) << graded.status();
  EXPECT_THAT(graded->reward, Optional(0.0));
  EXPECT_THAT(graded->correct, Optional(false));

  // Destroying an episode closes it on the server.
  episode->reset();
  wrong->reset();
  EXPECT_THAT(server.service().closed(), ElementsAre("ep-0", "ep-1"));
}

// A cut episode's Truncate is one Close flagged truncated, with the reason
// and the turn cut inside; its answer is the verdict, and the episode's
// end sends no second Close.
TEST(RemoteEnvironmentTest, TruncateIsAClosedFlaggedTruncatedWithItsVerdict) {
  FakeServer server;
  std::unique_ptr<Environment> env = MakeEnv(server.address());
  ASSERT_NE(env, nullptr);
  absl::StatusOr<std::unique_ptr<Episode>> episode =
      env->Open(TestProblem(), 7, Deadline(), nullptr);
  ASSERT_TRUE(episode.ok()) << episode.status();
  Cut cut;
  cut.reason = CutReason::kMaxEpisodeTokens;
  cut.turn = AnswerTurn("100");
  cut.turn->truncated = true;
  absl::StatusOr<Observation> verdict = (*episode)->Truncate(cut, Deadline());
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_THAT(verdict->reward, Optional(-0.75));
  EXPECT_EQ(verdict->correct, std::nullopt);
  EXPECT_THAT(verdict->metrics, ElementsAre(Pair("cut", 1.0)));
  episode->reset();
  const std::vector<pb::CloseEpisodeRequest> sent =
      server.service().close_requests();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_TRUE(sent[0].truncated());
  EXPECT_EQ(sent[0].reason(), pb::ENV_CUT_MAX_EPISODE_TOKENS);
  ASSERT_TRUE(sent[0].has_cut_turn());
  EXPECT_EQ(sent[0].cut_turn().text(), "100");
  EXPECT_TRUE(sent[0].cut_turn().truncated());

  // Cut by max_turns (no cut turn); an ordinary end stays untruncated.
  absl::StatusOr<std::unique_ptr<Episode>> turns =
      env->Open(TestProblem(), 8, Deadline(), nullptr);
  ASSERT_TRUE(turns.ok()) << turns.status();
  ASSERT_TRUE((*turns)->Truncate(Cut{}, Deadline()).ok());
  absl::StatusOr<std::unique_ptr<Episode>> plain =
      env->Open(TestProblem(), 9, Deadline(), nullptr);
  ASSERT_TRUE(plain.ok()) << plain.status();
  turns->reset();
  plain->reset();
  const std::vector<pb::CloseEpisodeRequest> all =
      server.service().close_requests();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[1].reason(), pb::ENV_CUT_MAX_TURNS);
  EXPECT_FALSE(all[1].has_cut_turn());
  EXPECT_FALSE(all[2].truncated());
}

TEST(RemoteEnvironmentTest, EpisodesSpreadBySeedModuloServers) {
  FakeServer a;
  FakeServer b;
  std::unique_ptr<Environment> env =
      MakeEnv(absl::StrCat(a.address(), " , ", b.address()));
  ASSERT_NE(env, nullptr);
  for (uint64_t seed : {0u, 1u, 2u, 5u, 7u}) {
    absl::StatusOr<std::unique_ptr<Episode>> episode =
        env->Open(TestProblem(), seed, Deadline(), nullptr);
    ASSERT_TRUE(episode.ok()) << episode.status();
  }
  std::vector<uint64_t> seeds_a;
  std::vector<uint64_t> seeds_b;
  for (const auto& open : a.service().opens()) seeds_a.push_back(open.seed());
  for (const auto& open : b.service().opens()) seeds_b.push_back(open.seed());
  EXPECT_THAT(seeds_a, ElementsAre(0u, 2u));
  EXPECT_THAT(seeds_b, ElementsAre(1u, 5u, 7u));
}

TEST(RemoteEnvironmentTest, StepThatNeverAnswersFailsAtTheDeadline) {
  FakeServer server;
  std::unique_ptr<Environment> env = MakeEnv(server.address());
  ASSERT_NE(env, nullptr);
  absl::StatusOr<std::unique_ptr<Episode>> episode =
      env->Open(TestProblem(), 0, Deadline(), nullptr);
  ASSERT_TRUE(episode.ok()) << episode.status();

  server.service().hang_step = true;
  const absl::Time begin = absl::Now();
  absl::StatusOr<Observation> step =
      (*episode)->Step(CallTurn(), begin + absl::Seconds(1));
  const absl::Duration took = absl::Now() - begin;
  EXPECT_EQ(step.status().code(), absl::StatusCode::kDeadlineExceeded)
      << step.status();
  EXPECT_THAT(step.status().message(),
              AllOf(HasSubstr("environment server " + server.address()),
                    HasSubstr("Step"), HasSubstr("DEADLINE_EXCEEDED")));
  EXPECT_GE(took, absl::Milliseconds(900));
  EXPECT_LT(took, absl::Seconds(3));

  // A deadline already past fails at once.
  absl::StatusOr<Observation> late =
      (*episode)->Step(CallTurn(), absl::Now() - absl::Seconds(1));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded)
      << late.status();
}

TEST(RemoteEnvironmentTest, KilledServerFailsFastAndRestartedOneIsUsedAgain) {
  auto server = std::make_unique<FakeServer>();
  const int port = server->port();
  const std::string address = server->address();
  std::unique_ptr<Environment> env = MakeEnv(address);
  ASSERT_NE(env, nullptr);
  absl::StatusOr<std::unique_ptr<Episode>> episode =
      env->Open(TestProblem(), 0, Deadline(), nullptr);
  ASSERT_TRUE(episode.ok()) << episode.status();

  server.reset();  // killed mid-episode
  const absl::Time begin = absl::Now();
  absl::StatusOr<Observation> step = (*episode)->Step(CallTurn(), Deadline());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kUnavailable)
      << step.status();
  EXPECT_THAT(step.status().message(),
              HasSubstr("environment server " + address + ": Step"));
  EXPECT_LT(absl::Now() - begin, absl::Seconds(5));
  episode->reset();  // its Close fails; the destructor must not hang
  EXPECT_LT(absl::Now() - begin, absl::Seconds(7));

  // A server restarted on the same port is used again within the reconnect
  // backoff (at most about a second).
  FakeServer restarted(port);
  ASSERT_EQ(restarted.port(), port);
  absl::StatusOr<std::unique_ptr<Episode>> again =
      absl::UnavailableError("not tried");
  const absl::Time restart = absl::Now();
  while (absl::Now() - restart < absl::Seconds(10)) {
    again = env->Open(TestProblem(), 0, Deadline(absl::Seconds(2)), nullptr);
    if (again.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_LT(absl::Now() - restart, absl::Seconds(4));
  absl::StatusOr<Observation> answer =
      (*again)->Step(AnswerTurn("10063"), Deadline());
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_THAT(answer->reward, Optional(1.0));
}

TEST(RemoteEnvironmentTest, UnknownEpisodeIsNotFound) {
  FakeServer server;
  std::unique_ptr<Environment> env = MakeEnv(server.address());
  ASSERT_NE(env, nullptr);
  absl::StatusOr<std::unique_ptr<Episode>> episode =
      env->Open(TestProblem(), 0, Deadline(), nullptr);
  ASSERT_TRUE(episode.ok()) << episode.status();
  // The server forgets the episode (as a restarted server would).
  {
    auto channel = grpc::CreateChannel(server.address(),
                                       grpc::InsecureChannelCredentials());
    auto stub = pb::EnvironmentService::NewStub(channel);
    grpc::ClientContext context;
    pb::CloseEpisodeRequest request;
    request.set_episode_id("ep-0");
    pb::CloseEpisodeResponse response;
    ASSERT_TRUE(stub->Close(&context, request, &response).ok());
  }
  absl::StatusOr<Observation> step = (*episode)->Step(CallTurn(), Deadline());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kNotFound) << step.status();
  EXPECT_THAT(step.status().message(),
              AllOf(HasSubstr(server.address()), HasSubstr("ep-0"),
                    HasSubstr("NOT_FOUND")));
}

TEST(RemoteEnvironmentTest, InvalidAnswersAreErrorsNotCrashes) {
  FakeServer server;
  std::unique_ptr<Environment> env = MakeEnv(server.address());
  ASSERT_NE(env, nullptr);

  server.service().empty_episode_id = true;
  absl::StatusOr<std::unique_ptr<Episode>> no_id =
      env->Open(TestProblem(), 0, Deadline(), nullptr);
  EXPECT_EQ(no_id.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(no_id.status().message(), HasSubstr("empty episode_id"));
  server.service().empty_episode_id = false;

  server.service().bad_role = true;
  EpisodeStart start;
  absl::StatusOr<std::unique_ptr<Episode>> robot =
      env->Open(TestProblem(), 0, Deadline(), &start);
  EXPECT_EQ(robot.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(robot.status().message(), HasSubstr("'robot'"));
  // The episode the server opened was closed all the same.
  EXPECT_THAT(server.service().closed(), Contains("ep-0"));
  server.service().bad_role = false;

  server.service().nan_reward = true;
  absl::StatusOr<std::unique_ptr<Episode>> episode =
      env->Open(TestProblem(), 0, Deadline(), nullptr);
  ASSERT_TRUE(episode.ok()) << episode.status();
  absl::StatusOr<Observation> nan =
      (*episode)->Step(AnswerTurn("10063"), Deadline());
  EXPECT_EQ(nan.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(nan.status().message(), HasSubstr("not a finite number"));
}

TEST(RemoteEnvironmentTest, BadAddressesAreInvalidArgument) {
  for (const char* address :
       {"", " ", "localhost", "localhost:", ":5000", "host:0", "host:70000",
        "host:5x", "a b:1", "127.0.0.1:5000,", "127.0.0.1:5000,,x:1",
        "[::1]5000", "dns:///x:1"}) {
    EnvConfig config;
    config.address = address;
    absl::StatusOr<std::unique_ptr<Environment>> env =
        MakeRemoteEnvironment(config);
    EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument)
        << "'" << address << "': " << env.status();
    EXPECT_THAT(env.status().message(), HasSubstr("env.address"));
  }
  for (const char* address :
       {"localhost:5000", "127.0.0.1:1, [::1]:65535", "env-1.local:80"}) {
    EnvConfig config;
    config.address = address;
    EXPECT_TRUE(MakeRemoteEnvironment(config).ok()) << address;
  }
}

TEST(RemoteEnvironmentTest, RegistrationIsIdempotent) {
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back(RegisterRemoteEnvironment);
  for (std::thread& t : threads) t.join();
  RegisterRemoteEnvironment();
  int remote = 0;
  for (const std::string& name : EnvironmentRegistry::Global().Names()) {
    remote += name == "remote";
  }
  EXPECT_EQ(remote, 1);

  EnvConfig config;
  config.name = "remote";
  absl::StatusOr<std::unique_ptr<Environment>> env =
      EnvironmentRegistry::Global().Create(config);
  EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument)
      << env.status();
  EXPECT_THAT(env.status().message(), HasSubstr("env.address"));

  FakeServer server;
  config.address = server.address();
  env = EnvironmentRegistry::Global().Create(config);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_TRUE((*env)->Open(TestProblem(), 0, Deadline(), nullptr).ok());
}

}  // namespace
}  // namespace fusionrl::rpc
