// WeightService over gRPC: the adapter between fusionrl.v1.WeightService and
// the controller's WeightStore.
//
// PublishWeights reads a client stream of chunks, one read in flight at a
// time, through a WeightChunkAssembler (weight_chunks.h: field consistency,
// offsets, per-chunk and whole-version CRC-32C, size limit) and, after the
// last chunk, Put()s the version into the store, passing the checked CRC
// along so the store verifies it once more. The reply is sent as soon as
// the last chunk is handled; the first error ends the call at once with:
//   INVALID_ARGUMENT     protocol violation, naming the chunk offset; also
//                        "stream ended before the last chunk";
//   DATA_LOSS            a chunk or whole-version checksum mismatch;
//   RESOURCE_EXHAUSTED   the version exceeds options.max_version_bytes;
//   FAILED_PRECONDITION  the version is not newer than the newest stored;
//   ALREADY_EXISTS       the version is stored with other bytes.
// Nothing is stored unless the whole stream checked out.
//
// FetchWeights looks the version up (0 = newest; NOT_FOUND names the kept
// versions) and streams it with a WeightChunker in chunks of
// options.fetch_chunk_bytes, one write in flight at a time: each
// OnWriteDone starts the next write. The reactor holds the version's
// shared bytes, so eviction during a fetch is harmless. A cancelled call,
// a client gone or a passed deadline fails the pending write; the reactor
// then finishes and frees itself in OnDone, whatever the order of events.
//
// Every reactor lives from its handler's return to its OnDone (which deletes
// it). Reactions never wait: they hash the chunk at hand and, after the last
// one, Put() the version (one more pass over it, under no lock).
//
// Ownership: borrows the store, which must outlive the service and the
// server it is registered with (Shutdown() the server first).
// Thread safety: the handlers may run concurrently on gRPC's threads; the
// store is internally locked, counters are atomic, and each reactor's
// callbacks are serialized by gRPC (one operation in flight).
//
// A server whose publishers send chunks above ~4 MiB must raise its receive
// limit: builder.SetMaxReceiveMessageSize(kMaxWeightChunkMessageBytes).
#ifndef FUSIONRL_RPC_WEIGHT_SERVICE_H_
#define FUSIONRL_RPC_WEIGHT_SERVICE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/weight_store.h"
#include "fusionrl/v1/weight.grpc.pb.h"
#include "rpc/weight_chunks.h"

namespace fusionrl::rpc {

struct WeightServiceOptions {
  // Data bytes per FetchWeights chunk; 1..kMaxWeightChunkBytes. Above about
  // 4 MiB - 64 KiB, fetching channels must raise their receive limit.
  size_t fetch_chunk_bytes = kDefaultWeightChunkBytes;
  // Largest version PublishWeights accepts; more is RESOURCE_EXHAUSTED.
  int64_t max_version_bytes = int64_t{1} << 30;
  // Shared token every call must carry; "" = no authentication.
  std::string auth_token;
};

class WeightServiceImpl final
    : public fusionrl::v1::WeightService::CallbackService {
 public:
  // Counters since construction.
  struct Stats {
    int64_t publishes_ok = 0;       // versions stored (or idempotent repeats)
    int64_t publishes_failed = 0;   // publish calls that ended in an error
    int64_t fetches_ok = 0;         // fetches that sent every chunk
    int64_t fetches_failed = 0;     // lookups that failed (NOT_FOUND, ...)
    int64_t fetches_cancelled = 0;  // fetches cut off after they started
    int64_t bytes_sent = 0;         // chunk data bytes written to clients
    int64_t calls_in_flight = 0;    // reactors not yet done (both methods)
  };

  // REQUIRES: 1 <= options.fetch_chunk_bytes <= kMaxWeightChunkBytes and
  // options.max_version_bytes >= 0 (aborts otherwise).
  explicit WeightServiceImpl(WeightStore& store,
                             WeightServiceOptions options = {});

  grpc::ServerReadReactor<fusionrl::v1::WeightChunk>* PublishWeights(
      grpc::CallbackServerContext* context,
      fusionrl::v1::PublishWeightsResponse* response) override;
  grpc::ServerWriteReactor<fusionrl::v1::WeightChunk>* FetchWeights(
      grpc::CallbackServerContext* context,
      const fusionrl::v1::FetchWeightsRequest* request) override;

  Stats stats() const;
  // "publishes ok=3 failed=1 fetches ok=5 failed=1 cancelled=1
  //  bytes_sent=12345 in_flight=0".
  std::string DebugString() const;

 private:
  class PublishReactor;
  class FetchReactor;
  class FailedFetchReactor;
  class FailedPublishReactor;

  struct Counters {
    std::atomic<int64_t> publishes_ok{0};
    std::atomic<int64_t> publishes_failed{0};
    std::atomic<int64_t> fetches_ok{0};
    std::atomic<int64_t> fetches_failed{0};
    std::atomic<int64_t> fetches_cancelled{0};
    std::atomic<int64_t> bytes_sent{0};
    std::atomic<int64_t> calls_in_flight{0};
  };

  WeightStore& store_;
  const WeightServiceOptions options_;
  Counters counters_;
};

}  // namespace fusionrl::rpc

#endif  // FUSIONRL_RPC_WEIGHT_SERVICE_H_
