// WeightService through a real gRPC server on 127.0.0.1 (port picked by the
// OS): the client helpers, raw streams that break the protocol, and a client
// that cancels mid-fetch.
#include "rpc/weight_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
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
#include "core/crc32c.h"
#include "core/fake_clock.h"
#include "core/weight_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/weight_chunks.h"
#include "rpc/weight_client.h"

namespace fusionrl::rpc {
namespace {

using fusionrl::v1::FetchWeightsRequest;
using fusionrl::v1::PublishWeightsResponse;
using fusionrl::v1::WeightChunk;
using fusionrl::v1::WeightService;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr absl::Duration kDeadline = absl::Seconds(10);

std::string Bytes(size_t n, int seed = 0) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    s[i] = static_cast<char>(i * 131 + (i >> 9) + seed * 7);
  }
  return s;
}

WeightServiceOptions Options(size_t fetch_chunk_bytes,
                             int64_t max_version_bytes) {
  WeightServiceOptions options;
  options.fetch_chunk_bytes = fetch_chunk_bytes;
  options.max_version_bytes = max_version_bytes;
  return options;
}

// A store, the service over it and a server on a free loopback port.
class TestServer {
 public:
  explicit TestServer(WeightServiceOptions options, int keep_versions = 3)
      : store_(clock_, keep_versions), service_(store_, options) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.SetMaxReceiveMessageSize(kMaxWeightChunkMessageBytes);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    EXPECT_GT(port, 0);
    stub_ = WeightService::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                            grpc::InsecureChannelCredentials()));
  }
  ~TestServer() {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
  }

  WeightStore& store() { return store_; }
  WeightServiceImpl& service() { return service_; }
  WeightService::Stub& stub() { return *stub_; }

  // Waits (up to 10 s) until every reactor has finished: none leaked.
  bool WaitIdle() {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (service_.stats().calls_in_flight != 0) {
      if (absl::Now() > give_up) return false;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return true;
  }

 private:
  FakeClock clock_;
  WeightStore store_;
  WeightServiceImpl service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<WeightService::Stub> stub_;
};

void SetDeadline(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
}

std::vector<WeightChunk> Chunks(const std::string& job_id, int64_t version,
                                const std::string& bytes, size_t chunk_bytes) {
  WeightChunker chunker(job_id, version, "sn-a", bytes, chunk_bytes);
  std::vector<WeightChunk> out;
  WeightChunk chunk;
  while (chunker.Next(&chunk)) out.push_back(chunk);
  return out;
}

// Sends `chunks` on a raw PublishWeights stream, then half-closes.
grpc::Status RawPublish(WeightService::Stub& stub,
                        const std::vector<WeightChunk>& chunks) {
  grpc::ClientContext context;
  SetDeadline(context);
  PublishWeightsResponse response;
  auto writer = stub.PublishWeights(&context, &response);
  for (const WeightChunk& c : chunks) {
    if (!writer->Write(c)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

class WeightServiceTest : public ::testing::Test {
 protected:
  // 1 KiB fetch chunks, versions up to 64 KiB.
  WeightServiceTest() : server_(Options(1024, 64 << 10)) {}

  TestServer server_;
};

TEST_F(WeightServiceTest, PublishThenFetchRoundTripsEverySize) {
  // Empty, one byte, exactly one chunk, a ragged many-chunk version.
  const std::vector<size_t> sizes = {0, 1, 1024, 2560, 10000};
  int64_t version = 0;
  for (size_t size : sizes) {
    ++version;
    const std::string bytes = Bytes(size, static_cast<int>(version));
    ASSERT_TRUE(PublishWeights(server_.stub(), "job-1", version, "sn-a", bytes,
                               1024, kDeadline)
                    .ok())
        << size;
    int64_t got_version = -1;
    absl::StatusOr<std::string> fetched =
        FetchWeights(server_.stub(), "job-1", version, kDeadline, &got_version);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(*fetched, bytes) << size;
    EXPECT_EQ(got_version, version);
    absl::StatusOr<WeightVersion> stored =
        server_.store().Get("job-1", version);
    ASSERT_TRUE(stored.ok());
    EXPECT_EQ(*stored->bytes, bytes);
    EXPECT_EQ(stored->super_node, "sn-a");
  }
  // Version 0 is the newest.
  int64_t newest = 0;
  absl::StatusOr<std::string> fetched =
      FetchWeights(server_.stub(), "job-1", 0, kDeadline, &newest);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(newest, version);
  EXPECT_EQ(*fetched, Bytes(10000, static_cast<int>(version)));
  EXPECT_TRUE(server_.WaitIdle());
  EXPECT_EQ(server_.service().stats().publishes_ok, 5);
  EXPECT_EQ(server_.service().stats().fetches_ok, 6);
}

TEST_F(WeightServiceTest, PublishChunkSizeNeedNotMatchFetchChunkSize) {
  const std::string bytes = Bytes(5000);
  for (size_t chunk : {1, 7, 4096, 5000, 8192}) {
    const int64_t version = static_cast<int64_t>(chunk);
    ASSERT_TRUE(PublishWeights(server_.stub(), "job-1", version, "sn-a", bytes,
                               chunk, kDeadline)
                    .ok());
    absl::StatusOr<std::string> fetched =
        FetchWeights(server_.stub(), "job-1", version, kDeadline, nullptr);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(*fetched, bytes);
  }
}

TEST(WeightServiceMiBTest, RoundTripsMiBChunksWithARaggedEnd) {
  // 2.5 MiB in 1 MiB chunks both ways.
  TestServer server(Options(1 << 20, 8 << 20));
  const std::string bytes = Bytes((5 << 20) / 2, 3);
  ASSERT_TRUE(PublishWeights(server.stub(), "job-1", 1, "sn-a", bytes, 1 << 20,
                             kDeadline)
                  .ok());
  absl::StatusOr<std::string> fetched =
      FetchWeights(server.stub(), "job-1", 1, kDeadline, nullptr);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(*fetched == bytes);
  EXPECT_EQ(server.service().stats().bytes_sent,
            static_cast<int64_t>(bytes.size()));

  // The server sends 3 chunks: 1 MiB, 1 MiB, 0.5 MiB.
  grpc::ClientContext context;
  SetDeadline(context);
  FetchWeightsRequest request;
  request.set_job_id("job-1");
  auto reader = server.stub().FetchWeights(&context, request);
  std::vector<size_t> sizes;
  WeightChunk chunk;
  while (reader->Read(&chunk)) sizes.push_back(chunk.data().size());
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_THAT(sizes, ElementsAre(1 << 20, 1 << 20, 1 << 19));
  EXPECT_TRUE(chunk.last());
  EXPECT_EQ(chunk.version_crc32c(), Crc32c(bytes));
}

TEST_F(WeightServiceTest, FetchOfAnEvictedOrUnknownVersionIsNotFound) {
  for (int64_t v = 1; v <= 5; ++v) {
    ASSERT_TRUE(PublishWeights(server_.stub(), "job-1", v, "sn-a", Bytes(100),
                               64, kDeadline)
                    .ok());
  }
  absl::StatusOr<std::string> evicted =
      FetchWeights(server_.stub(), "job-1", 2, kDeadline, nullptr);
  EXPECT_EQ(evicted.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(evicted.status().message(),
              HasSubstr("job-1 has no version 2; kept: 3, 4, 5"));
  absl::StatusOr<std::string> unknown =
      FetchWeights(server_.stub(), "job-9", 0, kDeadline, nullptr);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("job-9 has no weights"));

  // The raw gRPC status carries the same code and message.
  grpc::ClientContext context;
  SetDeadline(context);
  FetchWeightsRequest request;
  request.set_job_id("job-1");
  request.set_version(7);
  auto reader = server_.stub().FetchWeights(&context, request);
  WeightChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "job-1 has no version 7; kept: 3, 4, 5");
  EXPECT_TRUE(server_.WaitIdle());
  EXPECT_EQ(server_.service().stats().fetches_failed, 3);
}

TEST_F(WeightServiceTest, CorruptedChunkCrcIsDataLossAndStoresNothing) {
  std::vector<WeightChunk> chunks = Chunks("job-1", 1, Bytes(3000), 1024);
  chunks[1].set_crc32c(chunks[1].crc32c() ^ 0x4u);
  grpc::Status status = RawPublish(server_.stub(), chunks);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(status.error_message(), HasSubstr("chunk at offset 1024"));
  EXPECT_THAT(server_.store().Versions("job-1"), IsEmpty());
  EXPECT_EQ(server_.store().total_bytes(), 0);
}

TEST_F(WeightServiceTest, CorruptedDataOrVersionCrcIsDataLoss) {
  std::vector<WeightChunk> chunks = Chunks("job-1", 1, Bytes(3000), 1024);
  std::vector<WeightChunk> flipped = chunks;
  (*flipped[2].mutable_data())[5] ^= 0x1;
  grpc::Status status = RawPublish(server_.stub(), flipped);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(status.error_message(), HasSubstr("last chunk at offset 2048"));

  std::vector<WeightChunk> whole = chunks;
  whole[2].set_version_crc32c(whole[2].version_crc32c() + 1);
  status = RawPublish(server_.stub(), whole);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(status.error_message(), HasSubstr("whole version"));
  EXPECT_THAT(server_.store().Versions("job-1"), IsEmpty());

  // The intact stream is accepted afterwards.
  EXPECT_TRUE(RawPublish(server_.stub(), chunks).ok());
  EXPECT_THAT(server_.store().Versions("job-1"), ElementsAre(1));
}

TEST_F(WeightServiceTest, WrongOffsetIsInvalidArgument) {
  std::vector<WeightChunk> chunks = Chunks("job-1", 1, Bytes(3000), 1024);
  chunks.erase(chunks.begin() + 1);  // a gap
  grpc::Status status = RawPublish(server_.stub(), chunks);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("chunk at offset 2048: expected offset 1024"));

  chunks = Chunks("job-1", 1, Bytes(3000), 1024);
  std::swap(chunks[0], chunks[1]);  // out of order
  status = RawPublish(server_.stub(), chunks);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  chunks = Chunks("job-1", 1, Bytes(3000), 1024);
  chunks[2].set_version(2);  // fields change mid-stream
  status = RawPublish(server_.stub(), chunks);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("differs from the first"));
  EXPECT_THAT(server_.store().Versions("job-1"), IsEmpty());
}

TEST_F(WeightServiceTest, StreamWithoutALastChunkIsInvalidArgument) {
  std::vector<WeightChunk> chunks = Chunks("job-1", 1, Bytes(3000), 1024);
  chunks.pop_back();
  grpc::Status status = RawPublish(server_.stub(), chunks);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("stream ended before the last chunk"));
  EXPECT_THAT(status.error_message(), HasSubstr("2048 bytes received"));

  status = RawPublish(server_.stub(), {});  // no chunks at all
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("stream ended before the last chunk"));
  EXPECT_THAT(server_.store().Versions("job-1"), IsEmpty());
  EXPECT_TRUE(server_.WaitIdle());
  EXPECT_EQ(server_.service().stats().publishes_failed, 2);
}

TEST_F(WeightServiceTest, OversizePublishIsResourceExhausted) {
  // The server takes versions up to 64 KiB.
  absl::Status status = PublishWeights(server_.stub(), "job-1", 1, "sn-a",
                                       Bytes((64 << 10) + 1), 4096, kDeadline);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("over the limit of 65536 bytes"));
  EXPECT_THAT(server_.store().Versions("job-1"), IsEmpty());
  // Exactly the limit is fine.
  EXPECT_TRUE(PublishWeights(server_.stub(), "job-1", 1, "sn-a",
                             Bytes(64 << 10), 4096, kDeadline)
                  .ok());
}

TEST_F(WeightServiceTest, StoreRulesCrossTheWire) {
  const std::string bytes = Bytes(500);
  ASSERT_TRUE(
      PublishWeights(server_.stub(), "job-1", 5, "sn-a", bytes, 128, kDeadline)
          .ok());
  // A retry of the same version with the same bytes is fine.
  EXPECT_TRUE(
      PublishWeights(server_.stub(), "job-1", 5, "sn-a", bytes, 128, kDeadline)
          .ok());
  absl::Status other = PublishWeights(server_.stub(), "job-1", 5, "sn-a",
                                      Bytes(500, 1), 128, kDeadline);
  EXPECT_EQ(other.code(), absl::StatusCode::kAlreadyExists);
  absl::Status older =
      PublishWeights(server_.stub(), "job-1", 3, "sn-a", bytes, 128, kDeadline);
  EXPECT_EQ(older.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(older.message(),
              HasSubstr("version 3 is not newer than the newest stored "
                        "version 5"));
  EXPECT_EQ(
      PublishWeights(server_.stub(), "job-1", 0, "sn-a", bytes, 128, kDeadline)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST_F(WeightServiceTest, ClientHelpersRejectBadArgumentsLocally) {
  EXPECT_EQ(
      PublishWeights(server_.stub(), "job-1", 1, "sn-a", "x", 0, kDeadline)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PublishWeights(server_.stub(), "job-1", 1, "sn-a", "x",
                           kMaxWeightChunkBytes + 1, kDeadline)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PublishWeights(server_.stub(), "job-1", 1, "sn-a", "x", 1,
                           absl::ZeroDuration())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FetchWeights(server_.stub(), "job-1", 1, absl::InfiniteDuration(),
                         nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server_.store().Jobs(), IsEmpty());
  EXPECT_EQ(
      FetchWeights(server_.stub(), "", 0, kDeadline, nullptr).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(WeightServiceCancelTest, ClientCancellingMidFetchLeavesServerHealthy) {
  // 16 MiB in 16 KiB chunks: far more than flow control lets the server push
  // to a client that stopped reading, so the cancel lands mid-stream.
  TestServer server(Options(16 << 10, 32 << 20));
  const std::string bytes = Bytes(16 << 20, 5);
  ASSERT_TRUE(PublishWeights(server.stub(), "job-1", 1, "sn-a", bytes, 1 << 20,
                             kDeadline)
                  .ok());
  {
    grpc::ClientContext context;
    SetDeadline(context);
    FetchWeightsRequest request;
    request.set_job_id("job-1");
    auto reader = server.stub().FetchWeights(&context, request);
    WeightChunk chunk;
    ASSERT_TRUE(reader->Read(&chunk));
    EXPECT_EQ(chunk.offset(), 0);
    EXPECT_FALSE(chunk.last());
    context.TryCancel();
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The server's reactor finished and freed itself...
  ASSERT_TRUE(server.WaitIdle()) << server.service().DebugString();
  EXPECT_EQ(server.service().stats().fetches_cancelled, 1)
      << server.service().DebugString();
  EXPECT_EQ(server.service().stats().fetches_ok, 0);
  // ...and the server still serves.
  absl::StatusOr<std::string> fetched =
      FetchWeights(server.stub(), "job-1", 1, kDeadline, nullptr);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(*fetched == bytes);
  EXPECT_TRUE(server.WaitIdle());
}

TEST(WeightServiceCancelTest, EvictionDuringAFetchIsHarmless) {
  TestServer server(Options(1024, 1 << 20), /*keep_versions=*/1);
  const std::string bytes = Bytes(100 << 10, 1);
  ASSERT_TRUE(
      PublishWeights(server.stub(), "job-1", 1, "sn-a", bytes, 4096, kDeadline)
          .ok());
  grpc::ClientContext context;
  SetDeadline(context);
  FetchWeightsRequest request;
  request.set_job_id("job-1");
  request.set_version(1);
  auto reader = server.stub().FetchWeights(&context, request);
  WeightChunkAssembler assembler;
  WeightChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  ASSERT_TRUE(assembler.Add(chunk).ok());
  // Version 2 evicts version 1 while it is being streamed.
  ASSERT_TRUE(PublishWeights(server.stub(), "job-1", 2, "sn-a", Bytes(10), 4096,
                             kDeadline)
                  .ok());
  EXPECT_THAT(server.store().Versions("job-1"), ElementsAre(2));
  while (reader->Read(&chunk)) ASSERT_TRUE(assembler.Add(chunk).ok());
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_TRUE(assembler.done());
  EXPECT_TRUE(assembler.TakeBytes() == bytes);
}

// Four fetchers fetch the latest version in a loop while versions 2..20
// are published (each fetcher has fetched version 1 before they are), and
// each has fetched version 20 before they stop: every fetch is a whole
// version.
TEST_F(WeightServiceTest, ConcurrentPublishersAndFetchersSeeWholeVersions) {
  constexpr int64_t kVersions = 20;
  constexpr int kFetchers = 4;
  struct Seen {
    absl::Mutex mu;
    int fetched = 0;
    std::vector<int> fetches = std::vector<int>(kFetchers, 0);
    std::vector<int64_t> newest = std::vector<int64_t>(kFetchers, 0);
    bool failed = false;
    // Waits until every fetcher fetched a version >= `v` (or one failed);
    // true if they all did.
    bool AwaitAllAt(int64_t v) {
      absl::MutexLock lock(&mu);
      auto ready = [&] {
        return failed || std::all_of(newest.begin(), newest.end(),
                                     [v](int64_t n) { return n >= v; });
      };
      return mu.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(30)) &&
             !failed;
    }
  } seen;
  std::atomic<bool> done{false};
  std::vector<std::thread> fetchers;
  for (int t = 0; t < kFetchers; ++t) {
    fetchers.emplace_back([&, t] {
      while (!done.load()) {
        int64_t version = 0;
        absl::StatusOr<std::string> got =
            FetchWeights(server_.stub(), "job-1", 0, kDeadline, &version);
        if (got.status().code() == absl::StatusCode::kNotFound) continue;
        const bool whole = got.ok() && *got == Bytes(3000 + version,
                                                     static_cast<int>(version));
        EXPECT_TRUE(got.ok()) << got.status();
        EXPECT_TRUE(whole) << version;
        absl::MutexLock lock(&seen.mu);
        if (!whole) {
          seen.failed = true;
          return;
        }
        ++seen.fetched;
        ++seen.fetches[t];
        seen.newest[t] = std::max(seen.newest[t], version);
      }
    });
  }
  auto stop = [&] {
    done.store(true);
    for (auto& t : fetchers) t.join();
  };
  const absl::Status first = PublishWeights(server_.stub(), "job-1", 1, "sn-a",
                                            Bytes(3001, 1), 1000, kDeadline);
  // Every fetcher is fetching before the other versions are published.
  if (!first.ok() || !seen.AwaitAllAt(1)) {
    stop();
    FAIL() << "version 1: " << first << "; not every fetcher fetched it";
  }
  for (int64_t v = 2; v <= kVersions; ++v) {
    const absl::Status published =
        PublishWeights(server_.stub(), "job-1", v, "sn-a",
                       Bytes(3000 + v, static_cast<int>(v)), 1000, kDeadline);
    EXPECT_TRUE(published.ok()) << v << ": " << published;
  }
  // Every fetcher sees the last version too.
  const bool all_saw_last = seen.AwaitAllAt(kVersions);
  stop();
  EXPECT_TRUE(all_saw_last)
      << "not every fetcher fetched version " << kVersions;
  EXPECT_FALSE(seen.failed);
  EXPECT_THAT(seen.newest, ::testing::Each(kVersions));
  // Version 1 before the others were published, version 20 after.
  EXPECT_THAT(seen.fetches, ::testing::Each(::testing::Ge(2)));
  EXPECT_GE(seen.fetched, 8);
  EXPECT_TRUE(server_.WaitIdle());
}

}  // namespace
}  // namespace fusionrl::rpc
