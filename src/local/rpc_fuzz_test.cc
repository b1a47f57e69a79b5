// Bad input on the wire: random and mutated protobuf messages to every RPC
// of the controller (JobService, NodeService, WorkService, WeightService,
// streams included), with and without the token, while a real job runs on
// a real worker of the same controller. Every call must come back with a
// status within its deadline, the controller must stay responsive, and the
// job must still succeed with every prompt group trained once, and train
// what the same job trains without the fuzzing (its records, step for
// step, against an unfuzzed in-process run of the same config).
//
// Messages are filled through protobuf reflection (every field of every
// request type: extreme and negative numbers, unknown enum values, empty,
// random, huge and path-like strings, the real job's id, nested messages),
// then some are mutated at the byte level (flips, cuts, splices) and some
// replayed. With the token, calls never name the real worker's node: a
// caller holding the token may legitimately fail a job as its node, which
// is authority, not bad input.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/reflection.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "controller/controller.h"
#include "fusionrl/config.h"
#include "fusionrl/job.h"
#include "fusionrl/v1/job.grpc.pb.h"
#include "fusionrl/v1/node.grpc.pb.h"
#include "fusionrl/v1/weight.grpc.pb.h"
#include "fusionrl/v1/work.grpc.pb.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/worker.h"

namespace fusionrl {
namespace {

namespace pb = google::protobuf;

constexpr char kToken[] = "fuzz-token-0123456789abcdef";
// Deadline of every fuzzed call, and the slack a reply may take past it.
constexpr auto kCallDeadline = std::chrono::seconds(2);
constexpr absl::Duration kSlack = absl::Seconds(3);

// How long to fuzz: FUSIONRL_FUZZ_SECONDS, default 30.
int FuzzSeconds() {
  const char* s = std::getenv("FUSIONRL_FUZZ_SECONDS");
  const int n = s != nullptr ? std::atoi(s) : 0;
  return n > 0 ? n : 30;
}

class MessageFuzzer {
 public:
  MessageFuzzer(uint64_t seed, std::vector<std::string> avoid)
      : rng_(seed), avoid_(std::move(avoid)) {}

  // Strings never to send (with the token: the real worker's node id, and
  // for CancelJob the real job's id).
  void SetAvoid(std::vector<std::string> avoid) { avoid_ = std::move(avoid); }
  bool Avoids(const pb::Message& m) const {
    const std::string bytes = m.SerializePartialAsString();
    for (const std::string& a : avoid_) {
      if (bytes.find(a) != std::string::npos) return true;
    }
    return false;
  }

  void Fill(pb::Message& m, int depth = 0) {
    const pb::Descriptor* d = m.GetDescriptor();
    const pb::Reflection* r = m.GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const pb::FieldDescriptor* f = d->field(i);
      if (Chance(0.3)) continue;
      const int n = f->is_repeated() ? static_cast<int>(rng_() % 4) : 1;
      for (int k = 0; k < n; ++k) SetOne(m, r, f, depth);
    }
  }

  // Flips, cuts or splices bytes of `m`'s encoding; keeps `m` when the
  // result does not parse (gRPC would refuse it before our handlers).
  void Mutate(pb::Message& m) {
    std::string bytes = m.SerializeAsString();
    switch (rng_() % 3) {
      case 0:
        for (int i = 0; i < 4 && !bytes.empty(); ++i) {
          bytes[rng_() % bytes.size()] ^= static_cast<char>(1 << (rng_() % 8));
        }
        break;
      case 1:
        if (!bytes.empty()) bytes.resize(rng_() % bytes.size());
        break;
      default:
        bytes += RandomBytes(rng_() % 16);
        break;
    }
    std::unique_ptr<pb::Message> copy(m.New());
    if (copy->ParsePartialFromString(bytes)) m.CopyFrom(*copy);
  }

  bool Chance(double p) {
    return std::uniform_real_distribution<double>(0, 1)(rng_) < p;
  }
  uint64_t Next() { return rng_(); }

  std::string String() {
    static const std::vector<std::string> kInteresting = {
        "",
        "job-1",
        "job-0",
        "job-999999999999999999999",
        "node-0",
        "node-999",
        "node-18446744073709551615",
        "../../etc/passwd",
        "a/b",
        "sn-0",
        "\xff\xfe",
        "step_1",
        "final",
        "key.path=value",
        "%s%n"};
    std::string s;
    switch (rng_() % 5) {
      case 0:
        s = kInteresting[rng_() % kInteresting.size()];
        break;
      case 1:
        s = RandomBytes(rng_() % 64);
        break;
      case 2:
        s = std::string(1 + rng_() % 300, static_cast<char>('a' + rng_() % 26));
        break;
      case 3:
        // Huge, now and then (a chunk, a payload, a config).
        s = Chance(0.1) ? std::string(size_t{1} << (16 + rng_() % 6), 'x')
                        : std::string("job-1");
        break;
      default:
        s = absl::StrCat("node-", rng_() % 8);
        break;
    }
    for (const std::string& a : avoid_) {
      if (s == a) s = "node-777";
    }
    return s;
  }

 private:
  std::string RandomBytes(size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng_());
    return s;
  }

  int64_t Int() {
    static const int64_t kInteresting[] = {
        0,      1,         -1,        2,         7,         60000,
        -60000, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, 1 << 30};
    return Chance(0.7) ? kInteresting[rng_() % std::size(kInteresting)]
                       : static_cast<int64_t>(rng_());
  }

  void SetOne(pb::Message& m, const pb::Reflection* r,
              const pb::FieldDescriptor* f, int depth) {
    const bool rep = f->is_repeated();
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32:
        rep ? r->AddInt32(&m, f, static_cast<int32_t>(Int()))
            : r->SetInt32(&m, f, static_cast<int32_t>(Int()));
        break;
      case pb::FieldDescriptor::CPPTYPE_INT64:
        rep ? r->AddInt64(&m, f, Int()) : r->SetInt64(&m, f, Int());
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT32:
        rep ? r->AddUInt32(&m, f, static_cast<uint32_t>(Int()))
            : r->SetUInt32(&m, f, static_cast<uint32_t>(Int()));
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT64:
        rep ? r->AddUInt64(&m, f, static_cast<uint64_t>(Int()))
            : r->SetUInt64(&m, f, static_cast<uint64_t>(Int()));
        break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE: {
        static const double kValues[] = {0, -1, 1e300, -1e300, NAN, INFINITY};
        const double v = kValues[rng_() % std::size(kValues)];
        rep ? r->AddDouble(&m, f, v) : r->SetDouble(&m, f, v);
        break;
      }
      case pb::FieldDescriptor::CPPTYPE_FLOAT: {
        const float v = Chance(0.5) ? NAN : -1.0f;
        rep ? r->AddFloat(&m, f, v) : r->SetFloat(&m, f, v);
        break;
      }
      case pb::FieldDescriptor::CPPTYPE_BOOL:
        rep ? r->AddBool(&m, f, Chance(0.5)) : r->SetBool(&m, f, Chance(0.5));
        break;
      case pb::FieldDescriptor::CPPTYPE_ENUM: {
        const int v = static_cast<int>(rng_() % 12) - 2;  // unknown ones too
        rep ? r->AddEnumValue(&m, f, v) : r->SetEnumValue(&m, f, v);
        break;
      }
      case pb::FieldDescriptor::CPPTYPE_STRING: {
        // A string field must hold UTF-8 (the client's encoder refuses the
        // rest before it reaches the server); bytes fields take anything.
        std::string v = String();
        if (f->type() == pb::FieldDescriptor::TYPE_STRING) {
          for (char& c : v) {
            if (static_cast<unsigned char>(c) >= 0x80 || c == '\0') c = '?';
          }
        }
        rep ? r->AddString(&m, f, v) : r->SetString(&m, f, v);
        break;
      }
      case pb::FieldDescriptor::CPPTYPE_MESSAGE:
        if (depth >= 3) break;
        if (rep) {
          Fill(*r->AddMessage(&m, f), depth + 1);
        } else {
          Fill(*r->MutableMessage(&m, f), depth + 1);
        }
        break;
    }
  }

  std::mt19937_64 rng_;
  std::vector<std::string> avoid_;
};

// Counts what the calls returned, by status code.
struct Tally {
  std::mutex mu;
  std::map<int, int64_t> by_code;
  int64_t calls = 0;
  int64_t late = 0;  // returned more than kSlack past the deadline
  std::string late_what;
  void Add(grpc::StatusCode code, absl::Duration took, const char* what) {
    std::lock_guard<std::mutex> lock(mu);
    ++calls;
    ++by_code[static_cast<int>(code)];
    if (took > absl::FromChrono(kCallDeadline) + kSlack) {
      ++late;
      late_what = absl::StrCat(what, " took ", absl::FormatDuration(took));
    }
  }
};

class Fuzz {
 public:
  Fuzz(std::shared_ptr<grpc::Channel> channel, uint64_t seed,
       std::string real_node, std::string real_job, Tally& tally)
      : real_node_(std::move(real_node)),
        real_job_(std::move(real_job)),
        jobs_(v1::JobService::NewStub(channel)),
        nodes_(v1::NodeService::NewStub(channel)),
        work_(v1::WorkService::NewStub(channel)),
        weights_(v1::WeightService::NewStub(channel)),
        fuzzer_(seed, {}),
        tally_(tally) {}

  // One random call. `token`: whether it carries the right token.
  void Once(bool token) {
    const uint64_t rpc = fuzzer_.Next() % 15;
    if (!token) {
      fuzzer_.SetAvoid({});
    } else if (rpc == 2) {
      fuzzer_.SetAvoid({real_node_, real_job_});
    } else {
      fuzzer_.SetAvoid({real_node_});
    }
    switch (rpc) {
      case 0:
        Unary<v1::SubmitJobRequest, v1::SubmitJobResponse>(
            token, "SubmitJob", &v1::JobService::Stub::SubmitJob, jobs_.get());
        break;
      case 1:
        Unary<v1::GetJobStatusRequest, v1::JobStatus>(
            token, "GetJobStatus", &v1::JobService::Stub::GetJobStatus,
            jobs_.get());
        break;
      case 2:
        Unary<v1::CancelJobRequest, v1::JobStatus>(
            token, "CancelJob", &v1::JobService::Stub::CancelJob, jobs_.get());
        break;
      case 3:
        Unary<v1::ListJobsRequest, v1::ListJobsResponse>(
            token, "ListJobs", &v1::JobService::Stub::ListJobs, jobs_.get());
        break;
      case 4:
        Unary<v1::RegisterNodeRequest, v1::RegisterNodeResponse>(
            token, "RegisterNode", &v1::NodeService::Stub::RegisterNode,
            nodes_.get());
        break;
      case 5:
        Unary<v1::HeartbeatRequest, v1::HeartbeatResponse>(
            token, "Heartbeat", &v1::NodeService::Stub::Heartbeat,
            nodes_.get());
        break;
      case 6:
        Unary<v1::DeregisterNodeRequest, v1::DeregisterNodeResponse>(
            token, "DeregisterNode", &v1::NodeService::Stub::DeregisterNode,
            nodes_.get());
        break;
      case 7:
        Unary<v1::GetAssignmentRequest, v1::GetAssignmentResponse>(
            token, "GetAssignment", &v1::WorkService::Stub::GetAssignment,
            work_.get());
        break;
      case 8:
        Unary<v1::GetStepPlanRequest, v1::StepPlan>(
            token, "GetStepPlan", &v1::WorkService::Stub::GetStepPlan,
            work_.get());
        break;
      case 9:
        Unary<v1::ReduceRequest, v1::ReduceResponse>(
            token, "Reduce", &v1::WorkService::Stub::Reduce, work_.get());
        break;
      case 10:
        Unary<v1::FinishStepRequest, v1::FinishStepResponse>(
            token, "FinishStep", &v1::WorkService::Stub::FinishStep,
            work_.get());
        break;
      case 11:
        Unary<v1::ExchangeUpdatesRequest, v1::ExchangeUpdatesResponse>(
            token, "ExchangeUpdates", &v1::WorkService::Stub::ExchangeUpdates,
            work_.get());
        break;
      case 12:
        Unary<v1::StoreRequest, v1::StoreResponse>(
            token, "Store", &v1::WorkService::Stub::Store, work_.get());
        break;
      case 13:
        Publish(token);
        break;
      default:
        ServerStream(token);
        break;
    }
  }

 private:
  void Prepare(grpc::ClientContext& ctx, bool token) {
    ctx.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
    if (token) {
      ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    } else if (fuzzer_.Chance(0.5)) {
      static const char* kWrong[] = {"Bearer wrong", "Bearer ", "bearer x",
                                     "Basic abc", "Bearer fuzz-token"};
      ctx.AddMetadata("authorization", kWrong[fuzzer_.Next() % 5]);
    }
  }

  template <typename Req>
  Req Make(const char* name) {
    Req req;
    if (fuzzer_.Chance(0.2)) {
      // Replay an earlier request of this method.
      auto& seen = replay_[name];
      if (!seen.empty() &&
          req.ParseFromString(seen[fuzzer_.Next() % seen.size()]) &&
          !fuzzer_.Avoids(req)) {
        return req;
      }
      req.Clear();
    }
    fuzzer_.Fill(req);
    if (fuzzer_.Chance(0.3)) {
      Req mutated = req;
      fuzzer_.Mutate(mutated);
      if (!fuzzer_.Avoids(mutated)) req = std::move(mutated);
    }
    auto& seen = replay_[name];
    if (seen.size() >= 8) seen.pop_front();
    seen.push_back(req.SerializeAsString());
    return req;
  }

  template <typename Req, typename Resp, typename Stub, typename Method>
  void Unary(bool token, const char* name, Method method, Stub* stub) {
    Req req = Make<Req>(name);
    Resp resp;
    grpc::ClientContext ctx;
    Prepare(ctx, token);
    const absl::Time t0 = absl::Now();
    grpc::Status s = (stub->*method)(&ctx, req, &resp);
    tally_.Add(s.error_code(), absl::Now() - t0, name);
  }

  void Publish(bool token) {
    grpc::ClientContext ctx;
    Prepare(ctx, token);
    v1::PublishWeightsResponse resp;
    const absl::Time t0 = absl::Now();
    auto writer = weights_->PublishWeights(&ctx, &resp);
    const int chunks = static_cast<int>(fuzzer_.Next() % 4);
    for (int i = 0; i < chunks; ++i) {
      v1::WeightChunk c = Make<v1::WeightChunk>("PublishWeights");
      if (!writer->Write(c)) break;
    }
    writer->WritesDone();
    grpc::Status s = writer->Finish();
    tally_.Add(s.error_code(), absl::Now() - t0, "PublishWeights");
  }

  void ServerStream(bool token) {
    grpc::ClientContext ctx;
    Prepare(ctx, token);
    const absl::Time t0 = absl::Now();
    grpc::Status s;
    if (fuzzer_.Chance(0.5)) {
      v1::FetchWeightsRequest req =
          Make<v1::FetchWeightsRequest>("FetchWeights");
      auto reader = weights_->FetchWeights(&ctx, req);
      v1::WeightChunk c;
      while (reader->Read(&c)) {
      }
      s = reader->Finish();
      tally_.Add(s.error_code(), absl::Now() - t0, "FetchWeights");
    } else {
      v1::WatchJobRequest req = Make<v1::WatchJobRequest>("WatchJob");
      auto reader = jobs_->WatchJob(&ctx, req);
      v1::JobStatus st;
      while (reader->Read(&st)) {
      }
      s = reader->Finish();
      tally_.Add(s.error_code(), absl::Now() - t0, "WatchJob");
    }
  }

  const std::string real_node_, real_job_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::NodeService::Stub> nodes_;
  std::unique_ptr<v1::WorkService::Stub> work_;
  std::unique_ptr<v1::WeightService::Stub> weights_;
  MessageFuzzer fuzzer_;
  std::map<std::string, std::deque<std::string>> replay_;
  Tally& tally_;
};

std::string JobYaml(const std::string& out) {
  return absl::StrCat(R"(name: fuzzed
seed: 3
num_threads: 1
model: {d_model: 32, n_layers: 1, n_heads: 2, d_ff: 64, max_seq_len: 24}
task: {name: reverse, eval_size: 10, min_digits: 1, max_digits: 3,
       reward: char_match}  # partial credit: every step learns
rollout: {prompts_per_step: 4, group_size: 2, max_new_tokens: 5}
run: {eval_every: 0, total_steps: 40}
output_dir: ")",
                      out, "\"\n");
}

// The run's metrics.jsonl, one record per step.
std::vector<nlohmann::json> Records(const std::string& output_dir) {
  std::ifstream in(output_dir + "/metrics.jsonl");
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) {
    out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

TEST(RpcFuzzTest, BadCallsNeitherCrashNorHangAndAJobStillFinishes) {
  ControllerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.auth_token = kToken;
  options.heartbeat_timeout = absl::Seconds(10);
  auto controller = Controller::Start(options);
  ASSERT_TRUE(controller.ok()) << controller.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*controller)->port());

  // A real worker.
  WorkerOptions wopts;
  wopts.super_node = "sn-0";
  wopts.threads = 1;
  wopts.auth_token = kToken;
  wopts.poll_interval = absl::Milliseconds(200);
  Worker worker(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()), wopts);
  std::atomic<bool> stop{false};
  absl::Status worker_status;
  std::thread worker_thread([&] { worker_status = worker.Run(&stop); });
  const absl::Time registered_by = absl::Now() + absl::Seconds(30);
  while ((*controller)->registry().alive_count() == 0 &&
         absl::Now() < registered_by) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ((*controller)->registry().alive_count(), 1);
  const std::string real_node = (*controller)->registry().List()[0].id;

  // The job the fuzzing must not disturb.
  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto jobs = v1::JobService::NewStub(channel);
  const std::string out = ::testing::TempDir() + "/rpc-fuzz-job";
  std::filesystem::remove_all(out);
  v1::SubmitJobRequest submit;
  submit.set_config_yaml(JobYaml(out));
  v1::SubmitJobResponse submitted;
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    ASSERT_TRUE(jobs->SubmitJob(&ctx, submit, &submitted).ok());
  }
  const std::string job_id = submitted.job_id();

  Tally tally;
  const int seconds = FuzzSeconds();
  const absl::Time until = absl::Now() + absl::Seconds(seconds);
  std::vector<std::thread> fuzzers;
  for (int t = 0; t < 2; ++t) {
    fuzzers.emplace_back([&, t] {
      // Each thread on its own channel, like separate clients.
      Fuzz fuzz(
          grpc::CreateChannel(address, grpc::InsecureChannelCredentials()),
          /*seed=*/1000 + t, real_node, job_id, tally);
      std::mt19937_64 pick(t);
      while (absl::Now() < until) fuzz.Once(/*token=*/pick() % 2 == 0);
    });
  }
  for (std::thread& t : fuzzers) t.join();

  // Still answering at once.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(2));
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    v1::ListJobsResponse list;
    EXPECT_TRUE(jobs->ListJobs(&ctx, {}, &list).ok());
  }
  // The job finishes as if nothing happened.
  v1::JobStatus st;
  const absl::Time job_by = absl::Now() + absl::Seconds(300);
  for (;;) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    v1::GetJobStatusRequest req;
    req.set_job_id(job_id);
    ASSERT_TRUE(jobs->GetJobStatus(&ctx, req, &st).ok());
    if (st.phase() == v1::JOB_PHASE_SUCCEEDED ||
        st.phase() == v1::JOB_PHASE_FAILED ||
        st.phase() == v1::JOB_PHASE_CANCELLED || absl::Now() > job_by) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  stop = true;
  worker_thread.join();

  std::string codes;
  for (const auto& [code, n] : tally.by_code) {
    absl::StrAppend(&codes, " code ", code, ": ", n, ";");
  }
  std::printf("fuzz: %lld calls in %d s;%s %lld late\n",
              static_cast<long long>(tally.calls), seconds, codes.c_str(),
              static_cast<long long>(tally.late));
  EXPECT_GT(tally.calls, 100);
  EXPECT_EQ(tally.late, 0) << tally.late_what;
  EXPECT_GT(tally.by_code[grpc::StatusCode::UNAUTHENTICATED], 0);
  EXPECT_EQ(st.phase(), v1::JOB_PHASE_SUCCEEDED) << st.message();
  EXPECT_EQ(st.groups_trained(), 40 * 4);
  EXPECT_EQ(st.groups_submitted(), 40 * 4);

  // The same job without the fuzzing (in-process; one thread, so its
  // numbers repeat bit for bit): the fuzzed run trained the same steps.
  const std::string plain_out = ::testing::TempDir() + "/rpc-fuzz-plain";
  std::filesystem::remove_all(plain_out);
  absl::StatusOr<JobConfig> plain = ParseJobConfig(JobYaml(plain_out), "");
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(RunRlJob(*plain).ok());
  const std::vector<nlohmann::json> fuzzed = Records(out);
  const std::vector<nlohmann::json> unfuzzed = Records(plain_out);
  ASSERT_EQ(fuzzed.size(), 40u);
  ASSERT_EQ(unfuzzed.size(), 40u);
  for (size_t i = 0; i < fuzzed.size(); ++i) {
    for (const char* key :
         {"step", "attempt", "loss", "reward_mean", "grad_norm", "entropy",
          "rollout_tokens", "policy_version", "trained_group_id_sum"}) {
      EXPECT_EQ(fuzzed[i].value(key, -1.0), unfuzzed[i].value(key, -1.0))
          << "step " << i + 1 << ": " << key;
    }
  }
}

}  // namespace
}  // namespace fusionrl
