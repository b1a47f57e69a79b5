#include "cli/bench/bench_weights_cli.h"

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "cli/bench/bench_common.h"
#include "cli/common/exit_codes.h"
#include "core/clock.h"
#include "core/crc32c.h"
#include "core/metrics.h"
#include "core/status_macros.h"
#include "core/weight_store.h"
#include "engine/collectives/grad_sync.h"
#include "nlohmann/json.hpp"
#include "rpc/weight_chunks.h"
#include "rpc/weight_client.h"
#include "rpc/weight_service.h"
#include "spdlog/spdlog.h"

namespace fusionrl::cli {
namespace {

// Deadline of every collective and call: generous (a GiB over a slow
// loopback), never infinite.
constexpr absl::Duration kTimeout = absl::Minutes(5);
constexpr int64_t kMaxSizeMib = 4096;

// Now on the monotonic clock, for the measured intervals.
absl::Time Now() { return RealClock().MonotonicNow(); }

double Seconds(absl::Time a, absl::Time b) {
  return absl::ToDoubleSeconds(b - a);
}

absl::StatusOr<std::vector<int64_t>> ParseSizes(const std::string& text) {
  std::vector<int64_t> sizes;
  for (const absl::string_view part : absl::StrSplit(text, ',')) {
    const absl::string_view item = absl::StripAsciiWhitespace(part);
    int64_t mib = 0;
    if (!absl::SimpleAtoi(item, &mib) || mib < 1 || mib > kMaxSizeMib) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sizes-mib: '", item, "' is not a size in MiB (an ",
                       "integer in 1..", kMaxSizeMib, ")"));
    }
    sizes.push_back(mib);
  }
  return sizes;
}

// Serialized weights stand-in: every byte set, none repeating with a short
// period (so a misplaced chunk cannot compare equal).
std::string Payload(size_t n) {
  std::string s(n, '\0');
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(&s[i], &x, std::min<size_t>(8, n - i));
  }
  return s;
}

// memcpy into a buffer already touched (no page faults in the timing).
absl::StatusOr<double> TimeMemcpy(const std::string& payload,
                                  std::string& dst) {
  dst.assign(payload.size(), '\1');
  const absl::Time t0 = Now();
  std::memcpy(dst.data(), payload.data(), payload.size());
  const absl::Time t1 = Now();
  if (dst != payload) return absl::DataLossError("memcpy: bytes differ");
  return Seconds(t0, t1);
}

// One CRC-32C pass over `payload` (what each hop of the WeightService pays
// per byte, more than once), with `extend`.
template <typename Extend>
absl::StatusOr<double> TimeCrc(const std::string& payload, Extend extend) {
  const absl::Time t0 = Now();
  const uint32_t crc = extend(0, payload.data(), payload.size());
  const absl::Time t1 = Now();
  if (crc !=
      internal::Crc32cExtendPortable(0, payload.data(), payload.size())) {
    return absl::InternalError("CRC-32C paths disagree");
  }
  return Seconds(t0, t1);
}

// Runs `op(rank)` on every rank at once, after a barrier: the time from
// the first rank leaving the barrier to the last rank done.
absl::StatusOr<double> TimeOnEveryRank(
    std::vector<std::unique_ptr<GradientSync>>& group,
    const std::function<absl::Status(int rank)>& op) {
  struct Times {
    absl::Status status;
    absl::Time start, end;
  };
  std::vector<std::future<Times>> done;
  for (int r = 0; r < static_cast<int>(group.size()); ++r) {
    done.push_back(std::async(std::launch::async, [&, r] {
      Times t;
      std::vector<at::Tensor> barrier = {at::ones({1})};
      t.status = group[r]->AllReduceSum(barrier);
      t.start = Now();
      if (t.status.ok()) t.status = op(r);
      t.end = Now();
      return t;
    }));
  }
  absl::Time start = absl::InfiniteFuture();
  absl::Time end = absl::InfinitePast();
  absl::Status status;
  for (auto& f : done) {
    Times t = f.get();
    if (!t.status.ok()) {
      status.Update(t.status);
      continue;
    }
    start = std::min(start, t.start);
    end = std::max(end, t.end);
  }
  FUSIONRL_RETURN_IF_ERROR(status);
  return Seconds(start, end);
}

// Rank 0 broadcasts `payload` to the others (checked byte for byte).
absl::StatusOr<double> TimeBroadcast(
    std::vector<std::unique_ptr<GradientSync>>& group,
    const std::string& payload) {
  const int ranks = static_cast<int>(group.size());
  const int64_t n = static_cast<int64_t>(payload.size());
  std::vector<at::Tensor> buffers(ranks);
  for (int r = 0; r < ranks; ++r) buffers[r] = at::zeros({n}, at::kByte);
  std::memcpy(buffers[0].data_ptr(), payload.data(), payload.size());
  FUSIONRL_ASSIGN_OR_RETURN(const double seconds,
                            TimeOnEveryRank(group, [&](int r) {
                              std::vector<at::Tensor> b = {buffers[r]};
                              return group[r]->Broadcast(b, 0);
                            }));
  for (int r = 1; r < ranks; ++r) {
    if (std::memcmp(buffers[r].data_ptr(), payload.data(), payload.size())) {
      return absl::DataLossError(
          absl::StrCat("broadcast: rank ", r, " received other bytes"));
    }
  }
  return seconds;
}

// Every rank sums `bytes` of float32 ones (checked: `ranks` in every
// element).
absl::StatusOr<double> TimeAllReduce(
    std::vector<std::unique_ptr<GradientSync>>& group, int64_t bytes) {
  const int ranks = static_cast<int>(group.size());
  std::vector<at::Tensor> buffers(ranks);
  for (int r = 0; r < ranks; ++r) buffers[r] = at::ones({bytes / 4});
  FUSIONRL_ASSIGN_OR_RETURN(const double seconds,
                            TimeOnEveryRank(group, [&](int r) {
                              std::vector<at::Tensor> b = {buffers[r]};
                              return group[r]->AllReduceSum(b);
                            }));
  for (int r = 0; r < ranks; ++r) {
    if (!at::equal(buffers[r], at::full_like(buffers[r], ranks))) {
      return absl::DataLossError(
          absl::StrCat("all-reduce: rank ", r, " holds another sum"));
    }
  }
  return seconds;
}

// A WeightService on a loopback port, as the controller serves it.
class LoopbackWeightServer {
 public:
  explicit LoopbackWeightServer(int64_t max_bytes)
      : store_(RealClock(), 1), service_(store_, Options(max_bytes)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.SetMaxReceiveMessageSize(rpc::kMaxWeightChunkMessageBytes);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~LoopbackWeightServer() {
    if (server_ != nullptr) {
      server_->Shutdown(
          absl::ToChronoTime(RealClock().Now() + absl::Seconds(5)));
    }
  }
  bool ok() const { return server_ != nullptr && port_ > 0; }
  // A stub on its own channel (each fetcher one, as each worker has).
  std::unique_ptr<v1::WeightService::Stub> NewStub() const {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return v1::WeightService::NewStub(
        grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port_),
                                  grpc::InsecureChannelCredentials(), args));
  }

 private:
  static rpc::WeightServiceOptions Options(int64_t max_bytes) {
    rpc::WeightServiceOptions o;
    o.max_version_bytes = max_bytes;
    return o;
  }
  WeightStore store_;
  rpc::WeightServiceImpl service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

struct ServiceTimes {
  double publish = 0;
  double fetch = 0;  // until the last fetcher holds the bytes
};

// One publisher uploads `payload` as `version`, then `fetchers` fetch it at
// the same time, each on its own channel.
absl::StatusOr<ServiceTimes> TimeWeightService(
    v1::WeightService::Stub& publisher,
    std::vector<std::unique_ptr<v1::WeightService::Stub>>& fetchers,
    const std::string& payload, int64_t version) {
  ServiceTimes out;
  const absl::Time t0 = Now();
  FUSIONRL_RETURN_IF_ERROR(
      rpc::PublishWeights(publisher, "bench", version, "sn-0", payload,
                          rpc::kDefaultWeightChunkBytes, kTimeout));
  const absl::Time t1 = Now();
  std::vector<std::future<absl::StatusOr<std::string>>> got;
  for (auto& stub : fetchers) {
    got.push_back(std::async(std::launch::async, [&stub, version] {
      return rpc::FetchWeights(*stub, "bench", version, kTimeout, nullptr);
    }));
  }
  absl::Status status;
  std::vector<std::string> bytes;
  for (auto& f : got) {
    absl::StatusOr<std::string> b = f.get();
    if (!b.ok()) {
      status.Update(b.status());
      continue;
    }
    bytes.push_back(*std::move(b));
  }
  const absl::Time t2 = Now();
  FUSIONRL_RETURN_IF_ERROR(status);
  for (const std::string& b : bytes) {
    if (b != payload) {
      return absl::DataLossError("weight service: fetched other bytes");
    }
  }
  out.publish = Seconds(t0, t1);
  out.fetch = Seconds(t1, t2);
  return out;
}

}  // namespace

CLI::App* AddBenchWeightsCommand(CLI::App& app, BenchWeightsArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "bench-weights",
      "weight sync bytes/s on loopback: memcpy vs a Gloo broadcast vs the "
      "controller's WeightService (publish + fetch); JSON out");
  cmd->add_option("--sizes-mib", args.sizes_mib,
                  "comma-separated payload sizes in MiB (default 16,64,256)");
  cmd->add_option("--ranks", args.ranks,
                  "one sender and ranks-1 receivers (default 2)")
      ->check(CLI::Range(2, 16));
  cmd->add_option("--repeats", args.repeats,
                  "timed runs per size and path (default 5)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--out", args.out, "write the JSON here (default stdout)");
  return cmd;
}

int RunBenchWeights(const BenchWeightsArgs& args) {
  absl::StatusOr<std::vector<int64_t>> sizes = ParseSizes(args.sizes_mib);
  if (!sizes.ok()) return Fail(sizes.status());
  const int64_t largest = *std::max_element(sizes->begin(), sizes->end()) << 20;

  absl::StatusOr<std::vector<std::unique_ptr<GradientSync>>> group =
      MakeLocalGlooGroup(args.ranks, kTimeout);
  if (!group.ok()) return Fail(group.status());
  // The same sum as one message, for the buckets' side-by-side figure.
  absl::StatusOr<std::vector<std::unique_ptr<GradientSync>>> unbucketed =
      MakeLocalGlooGroup(args.ranks, kTimeout,
                         std::numeric_limits<int64_t>::max());
  if (!unbucketed.ok()) return Fail(unbucketed.status());
  LoopbackWeightServer server(largest);
  if (!server.ok()) {
    return Fail(absl::UnavailableError(
        "bench-weights: cannot start a WeightService on 127.0.0.1"));
  }
  std::unique_ptr<v1::WeightService::Stub> publisher = server.NewStub();
  std::vector<std::unique_ptr<v1::WeightService::Stub>> fetchers;
  for (int r = 1; r < args.ranks; ++r) fetchers.push_back(server.NewStub());

  nlohmann::ordered_json result;
  result["benchmark"] = "bench-weights";
  result["ranks"] = args.ranks;
  result["repeats"] = args.repeats;
  result["threads"] = static_cast<int>(std::thread::hardware_concurrency());
  result["chunk_bytes"] = rpc::kDefaultWeightChunkBytes;
  result["gradient_bucket_bytes"] = kGradientBucketBytes;
  result["crc32c_instruction"] = internal::Crc32cHasHardwarePath();
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  int64_t version = 0;
  for (const int64_t mib : *sizes) {
    const std::string payload = Payload(static_cast<size_t>(mib) << 20);
    std::string dst;
    std::vector<double> copy, bcast, publish, fetch, service, crc_portable, crc,
        sum_buckets, sum_one;
    // One untimed round of each path first (connections, first touches).
    for (int rep = -1; rep < args.repeats; ++rep) {
      absl::StatusOr<double> c = TimeMemcpy(payload, dst);
      if (!c.ok()) return Fail(c.status());
      absl::StatusOr<double> b = TimeBroadcast(*group, payload);
      if (!b.ok()) return Fail(b.status());
      absl::StatusOr<double> sb = TimeAllReduce(*group, mib << 20);
      if (!sb.ok()) return Fail(sb.status());
      absl::StatusOr<double> so = TimeAllReduce(*unbucketed, mib << 20);
      if (!so.ok()) return Fail(so.status());
      absl::StatusOr<ServiceTimes> w =
          TimeWeightService(*publisher, fetchers, payload, ++version);
      if (!w.ok()) return Fail(w.status());
      absl::StatusOr<double> cp =
          TimeCrc(payload, &internal::Crc32cExtendPortable);
      if (!cp.ok()) return Fail(cp.status());
      absl::StatusOr<double> ch = TimeCrc(payload, &Crc32cExtend);
      if (!ch.ok()) return Fail(ch.status());
      if (rep < 0) continue;
      crc_portable.push_back(*cp);
      crc.push_back(*ch);
      copy.push_back(*c);
      bcast.push_back(*b);
      sum_buckets.push_back(*sb);
      sum_one.push_back(*so);
      publish.push_back(w->publish);
      fetch.push_back(w->fetch);
      service.push_back(w->publish + w->fetch);
    }
    const double bytes = static_cast<double>(payload.size());
    const double memcpy_bps = bytes / Median(copy);
    auto path = [&](const std::vector<double>& seconds) {
      const double median = Median(seconds);
      nlohmann::ordered_json p;
      p["median_seconds"] = median;
      p["bytes_per_second"] = bytes / median;
      p["ratio_to_memcpy"] = bytes / median / memcpy_bps;
      p["seconds"] = seconds;
      return p;
    };
    nlohmann::ordered_json row;
    row["mib"] = mib;
    row["memcpy"] = path(copy);
    row["gloo_broadcast"] = path(bcast);
    row["gloo_allreduce_buckets"] = path(sum_buckets);
    row["gloo_allreduce_one_message"] = path(sum_one);
    row["weight_service_publish"] = path(publish);
    row["weight_service_fetch"] = path(fetch);
    row["weight_service_sync"] = path(service);
    row["crc32c_tables"] = path(crc_portable);
    row["crc32c"] = path(crc);
    spdlog::info(
        "bench-weights {} MiB: memcpy {:.2f} GB/s, gloo broadcast {:.2f} GB/s "
        "({:.3f}x), weight service publish+fetch {:.2f} GB/s ({:.3f}x); "
        "all-reduce in {} MiB buckets {:.2f} GB/s, as one message {:.2f} GB/s",
        mib, memcpy_bps / 1e9,
        row["gloo_broadcast"]["bytes_per_second"].get<double>() / 1e9,
        row["gloo_broadcast"]["ratio_to_memcpy"].get<double>(),
        row["weight_service_sync"]["bytes_per_second"].get<double>() / 1e9,
        row["weight_service_sync"]["ratio_to_memcpy"].get<double>(),
        kGradientBucketBytes >> 20,
        row["gloo_allreduce_buckets"]["bytes_per_second"].get<double>() / 1e9,
        row["gloo_allreduce_one_message"]["bytes_per_second"].get<double>() /
            1e9);
    rows.push_back(std::move(row));
  }
  result["sizes"] = std::move(rows);
  return WriteBenchResult(result, args.out);
}

}  // namespace fusionrl::cli
