#include "rpc/weight_service.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "rpc/auth.h"
#include "rpc/status_convert.h"

namespace fusionrl::rpc {
namespace {

using fusionrl::v1::FetchWeightsRequest;
using fusionrl::v1::PublishWeightsResponse;
using fusionrl::v1::WeightChunk;

}  // namespace

// A FetchWeights call that failed before its first write: finishes at once
// and frees itself when gRPC is done with it.
class WeightServiceImpl::FailedFetchReactor final
    : public grpc::ServerWriteReactor<WeightChunk> {
 public:
  FailedFetchReactor(const absl::Status& status, Counters& counters)
      : counters_(counters) {
    counters_.calls_in_flight.fetch_add(1, std::memory_order_relaxed);
    Finish(ToGrpcStatus(status));
  }
  void OnDone() override {
    counters_.calls_in_flight.fetch_sub(1, std::memory_order_relaxed);
    delete this;
  }

 private:
  Counters& counters_;
};

// Ends a publish before reading anything (e.g. UNAUTHENTICATED).
class WeightServiceImpl::FailedPublishReactor final
    : public grpc::ServerReadReactor<WeightChunk> {
 public:
  FailedPublishReactor(const grpc::Status& status, Counters& counters)
      : counters_(counters) {
    counters_.calls_in_flight.fetch_add(1, std::memory_order_relaxed);
    Finish(status);
  }
  void OnDone() override {
    counters_.calls_in_flight.fetch_sub(1, std::memory_order_relaxed);
    delete this;
  }

 private:
  Counters& counters_;
};

// Reads chunks one at a time into an assembler; stores the version after the
// last one. Lives until OnDone.
class WeightServiceImpl::PublishReactor final
    : public grpc::ServerReadReactor<WeightChunk> {
 public:
  PublishReactor(WeightStore& store, int64_t max_version_bytes,
                 Counters& counters, PublishWeightsResponse* response)
      : store_(store),
        counters_(counters),
        response_(response),
        assembler_(max_version_bytes) {
    counters_.calls_in_flight.fetch_add(1, std::memory_order_relaxed);
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client half-closed (or the call was cancelled) before the last
      // chunk; if cancelled, the status never reaches anyone, but Finish is
      // still owed.
      Done(absl::InvalidArgumentError(assembler_.EndedEarlyMessage()));
      return;
    }
    absl::Status status = assembler_.Add(chunk_);
    if (!status.ok()) {
      Done(status);
      return;
    }
    if (!assembler_.done()) {
      StartRead(&chunk_);
      return;
    }
    // The whole version checked out: store it (the store re-checks the CRC
    // it computes against ours, so a bug between here and there is caught).
    const int64_t version = assembler_.version();
    const int64_t total = assembler_.bytes_received();
    const uint32_t crc = assembler_.crc32c();
    status = store_.Put(assembler_.job_id(), version, assembler_.super_node(),
                        assembler_.TakeBytes(), crc);
    if (status.ok()) {
      response_->set_version(version);
      response_->set_total_bytes(total);
    }
    Done(status);
  }

  void OnDone() override {
    counters_.calls_in_flight.fetch_sub(1, std::memory_order_relaxed);
    delete this;
  }

 private:
  void Done(const absl::Status& status) {
    (status.ok() ? counters_.publishes_ok : counters_.publishes_failed)
        .fetch_add(1, std::memory_order_relaxed);
    Finish(ToGrpcStatus(status));
  }

  WeightStore& store_;
  Counters& counters_;
  PublishWeightsResponse* const response_;  // owned by gRPC, valid to OnDone
  WeightChunkAssembler assembler_;
  WeightChunk chunk_;  // the read target, reused
};

// Writes one version's chunks, one write in flight at a time. Lives until
// OnDone; holds the version's bytes alive until then.
class WeightServiceImpl::FetchReactor final
    : public grpc::ServerWriteReactor<WeightChunk> {
 public:
  FetchReactor(WeightVersion version, size_t chunk_bytes, Counters& counters)
      : version_(std::move(version)),
        counters_(counters),
        chunker_(version_.job_id, version_.version, version_.super_node,
                 *version_.bytes, chunk_bytes, version_.crc32c) {
    counters_.calls_in_flight.fetch_add(1, std::memory_order_relaxed);
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      // Cancelled, deadline passed or the client went away. Nothing will
      // reach the client; Finish is still owed so that OnDone comes.
      counters_.fetches_cancelled.fetch_add(1, std::memory_order_relaxed);
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          "FetchWeights cancelled before the last chunk"));
      return;
    }
    counters_.bytes_sent.fetch_add(static_cast<int64_t>(chunk_.data().size()),
                                   std::memory_order_relaxed);
    if (chunker_.done()) {
      counters_.fetches_ok.fetch_add(1, std::memory_order_relaxed);
      Finish(grpc::Status::OK);
      return;
    }
    WriteNext();
  }

  void OnDone() override {
    counters_.calls_in_flight.fetch_sub(1, std::memory_order_relaxed);
    delete this;
  }

 private:
  void WriteNext() {
    chunker_.Next(&chunk_);  // true: called only while !chunker_.done()
    StartWrite(&chunk_);
  }

  const WeightVersion version_;  // declared before chunker_, which views it
  Counters& counters_;
  WeightChunker chunker_;
  WeightChunk chunk_;  // the write in flight; untouched until OnWriteDone
};

WeightServiceImpl::WeightServiceImpl(WeightStore& store,
                                     WeightServiceOptions options)
    : store_(store), options_(options) {
  if (options.fetch_chunk_bytes < 1 ||
      options.fetch_chunk_bytes > kMaxWeightChunkBytes ||
      options.max_version_bytes < 0) {  // a broken invariant
    std::fprintf(stderr,
                 "WeightServiceImpl: need 1 <= fetch_chunk_bytes <= %zu and "
                 "max_version_bytes >= 0, got %zu and %lld\n",
                 kMaxWeightChunkBytes, options.fetch_chunk_bytes,
                 static_cast<long long>(options.max_version_bytes));
    std::abort();
  }
}

grpc::ServerReadReactor<WeightChunk>* WeightServiceImpl::PublishWeights(
    grpc::CallbackServerContext* context, PublishWeightsResponse* response) {
  if (grpc::Status auth = CheckAuth(*context, options_.auth_token);
      !auth.ok()) {
    counters_.publishes_failed.fetch_add(1, std::memory_order_relaxed);
    return new FailedPublishReactor(auth, counters_);
  }
  return new PublishReactor(store_, options_.max_version_bytes, counters_,
                            response);
}

grpc::ServerWriteReactor<WeightChunk>* WeightServiceImpl::FetchWeights(
    grpc::CallbackServerContext* context, const FetchWeightsRequest* request) {
  absl::Status status;
  if (grpc::Status auth = CheckAuth(*context, options_.auth_token);
      !auth.ok()) {
    status = FromGrpcStatus(auth);
  } else if (request->job_id().empty()) {
    status = absl::InvalidArgumentError("job_id: must not be empty");
  } else {
    absl::StatusOr<WeightVersion> version =
        store_.Get(request->job_id(), request->version());
    if (version.ok()) {
      return new FetchReactor(*std::move(version), options_.fetch_chunk_bytes,
                              counters_);
    }
    status = version.status();
  }
  counters_.fetches_failed.fetch_add(1, std::memory_order_relaxed);
  return new FailedFetchReactor(status, counters_);
}

WeightServiceImpl::Stats WeightServiceImpl::stats() const {
  Stats s;
  s.publishes_ok = counters_.publishes_ok.load(std::memory_order_relaxed);
  s.publishes_failed =
      counters_.publishes_failed.load(std::memory_order_relaxed);
  s.fetches_ok = counters_.fetches_ok.load(std::memory_order_relaxed);
  s.fetches_failed = counters_.fetches_failed.load(std::memory_order_relaxed);
  s.fetches_cancelled =
      counters_.fetches_cancelled.load(std::memory_order_relaxed);
  s.bytes_sent = counters_.bytes_sent.load(std::memory_order_relaxed);
  s.calls_in_flight = counters_.calls_in_flight.load(std::memory_order_relaxed);
  return s;
}

std::string WeightServiceImpl::DebugString() const {
  const Stats s = stats();
  return absl::StrCat(
      "publishes ok=", s.publishes_ok, " failed=", s.publishes_failed,
      " fetches ok=", s.fetches_ok, " failed=", s.fetches_failed,
      " cancelled=", s.fetches_cancelled, " bytes_sent=", s.bytes_sent,
      " in_flight=", s.calls_in_flight);
}

}  // namespace fusionrl::rpc
