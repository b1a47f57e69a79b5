#include "engine/collectives/grad_sync.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace fusionrl {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

class GlooGradientSync final : public GradientSync {
 public:
  GlooGradientSync(c10::intrusive_ptr<c10d::ProcessGroupGloo> group, int rank,
                   int world, absl::Duration timeout,
                   std::function<absl::Status()> probe = nullptr,
                   int64_t bucket_bytes = kGradientBucketBytes)
      : group_(std::move(group)),
        rank_(rank),
        world_(world),
        timeout_(timeout),
        probe_(std::move(probe)),
        bucket_bytes_(std::max<int64_t>(1, bucket_bytes)) {}

  ~GlooGradientSync() override {
    // Collectives this rank gave up on (a peer froze) or never waited for
    // (the job ended with StaleSync sums in flight) still run in Gloo's
    // thread until they finish or time out; destroying the group now would
    // wait for them. Let a detached thread hold the group until then.
    std::vector<c10::intrusive_ptr<c10d::Work>> left;
    if (pending_) left.push_back(std::move(pending_));
    for (auto& [ticket, works] : started_) {
      for (auto& work : works) {
        if (!work->isCompleted()) left.push_back(std::move(work));
      }
    }
    if (left.empty()) return;
    std::thread([group = std::move(group_), left = std::move(left)] {
      for (const auto& work : left) {
        try {
          work->wait();
        } catch (const std::exception&) {
        }
      }
    }).detach();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  absl::Status AllReduceSum(std::vector<at::Tensor>& tensors) override {
    if (tensors.empty()) return absl::OkStatus();
    FUSIONRL_RETURN_IF_ERROR(Usable());
    try {
      const at::Tensor flat = Flat(tensors);
      FUSIONRL_RETURN_IF_ERROR(AwaitAll(StartBuckets(flat), "all-reduce"));
      CopyBack(flat, tensors);
    } catch (const std::exception& e) {
      // c10d reports a timed-out or broken peer as an exception.
      return Failed("gradient all-reduce", e);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> StartAllReduceSum(at::Tensor flat) override {
    FUSIONRL_RETURN_IF_ERROR(Usable());
    try {
      const int64_t ticket = next_ticket_++;
      started_.emplace(ticket, StartBuckets(flat.view({-1})));
      return ticket;
    } catch (const std::exception& e) {
      return Failed("starting an all-reduce", e);
    }
  }

  absl::Status WaitAllReduceSum(int64_t ticket) override {
    auto it = started_.find(ticket);
    if (it == started_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("all-reduce ticket ", ticket, " of gloo group rank ",
                       rank_, " was not started or was waited for already"));
    }
    FUSIONRL_RETURN_IF_ERROR(Usable());
    std::vector<c10::intrusive_ptr<c10d::Work>> works = std::move(it->second);
    started_.erase(it);
    try {
      return AwaitAll(works, "all-reduce");
    } catch (const std::exception& e) {
      return Failed("all-reduce", e);
    }
  }

  absl::Status Broadcast(std::vector<at::Tensor>& tensors, int root) override {
    if (tensors.empty()) return absl::OkStatus();
    if (root < 0 || root >= world_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "broadcast: root ", root, " is not in [0, ", world_, ")"));
    }
    FUSIONRL_RETURN_IF_ERROR(Usable());
    for (const at::Tensor& t : tensors) {
      if (t.scalar_type() != tensors[0].scalar_type()) {
        return absl::InvalidArgumentError(
            "broadcast: the tensors must share one dtype");
      }
    }
    try {
      std::vector<at::Tensor> buffer = {Flat(tensors)};
      c10d::BroadcastOptions options;
      options.rootRank = root;
      auto work = group_->broadcast(buffer, options);
      FUSIONRL_RETURN_IF_ERROR(Await(work, "broadcast", absl::Now()));
      if (rank_ != root) CopyBack(buffer[0], tensors);
    } catch (const std::exception& e) {
      return Failed("broadcast", e);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<at::Tensor> AllToAll(
      const at::Tensor& input, const std::vector<int64_t>& send_rows,
      const std::vector<int64_t>& recv_rows) override {
    int64_t sent = 0, received = 0;
    for (int64_t n : send_rows) sent += n;
    for (int64_t n : recv_rows) received += n;
    if (static_cast<int>(send_rows.size()) != world_ ||
        static_cast<int>(recv_rows.size()) != world_ || input.dim() < 1 ||
        sent != input.size(0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "all-to-all: rank ", rank_, " of ", world_, " sends ", sent,
          " rows in ", send_rows.size(), " parts of a tensor of ",
          input.dim() < 1 ? 0 : input.size(0), " rows"));
    }
    FUSIONRL_RETURN_IF_ERROR(Usable());
    try {
      const absl::Time start = absl::Now();
      std::vector<int64_t> shape = input.sizes().vec();
      shape[0] = received;
      at::Tensor out = at::empty(shape, input.options());
      at::Tensor in = input.contiguous();
      std::vector<int64_t> out_splits = recv_rows, in_splits = send_rows;
      auto work = group_->alltoall_base(out, in, out_splits, in_splits);
      FUSIONRL_RETURN_IF_ERROR(Await(work, "all-to-all", start));
      const int64_t row_bytes =
          sent > 0 ? in.numel() / sent * static_cast<int64_t>(in.itemsize())
                   : 0;
      ++all_to_all_.calls;
      all_to_all_.bytes += (sent - send_rows[rank_]) * row_bytes;
      all_to_all_.seconds += absl::ToDoubleSeconds(absl::Now() - start);
      return out;
    } catch (const std::exception& e) {
      return Failed("all-to-all", e);
    }
  }

 private:
  // Waits for `work` (throws what c10d throws). Without a probe, one wait
  // of the group's timeout. With one, waits in slices and, once the
  // collective has taken longer than kProbeAfter, asks the probe after each
  // slice: an error from it abandons the collective (and the group) at
  // once, so a frozen peer holds this rank only until the controller has
  // declared it lost, not for the whole collective timeout.
  // The group's timeout counts from `start` (shared by the buckets of one
  // sum).
  absl::Status Await(const c10::intrusive_ptr<c10d::Work>& work,
                     const char* what, absl::Time start) {
    if (!probe_) {
      const absl::Duration left =
          std::max(absl::Milliseconds(1), timeout_ - (absl::Now() - start));
      work->wait(ToChrono(left));
      return absl::OkStatus();
    }
    constexpr absl::Duration kSlice = absl::Milliseconds(200);
    constexpr absl::Duration kProbeAfter = absl::Seconds(1);
    for (;;) {
      if (internal::WaitSlice(work, kSlice)) return absl::OkStatus();
      const absl::Duration waited = absl::Now() - start;
      if (waited >= timeout_) {
        pending_ = work;
        return absl::DeadlineExceededError(absl::StrCat(
            what, " (rank ", rank_, " of ", world_, ") did not finish within ",
            absl::FormatDuration(timeout_)));
      }
      if (waited < kProbeAfter) continue;
      if (absl::Status s = probe_(); !s.ok()) {
        pending_ = work;
        return absl::Status(
            s.code(),
            absl::StrCat(what, " (rank ", rank_, " of ", world_,
                         ") abandoned after ", absl::FormatDuration(waited),
                         ": ", s.message()));
      }
    }
  }

  // Starts the all-reduce of `flat` (1-D, contiguous) in buckets of at
  // most bucket_bytes_, in order: each a view, summed in place.
  std::vector<c10::intrusive_ptr<c10d::Work>> StartBuckets(
      const at::Tensor& flat) {
    const int64_t per = std::max<int64_t>(
        1, bucket_bytes_ / std::max<int64_t>(1, flat.element_size()));
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (int64_t at = 0; at < flat.numel() || works.empty(); at += per) {
      std::vector<at::Tensor> bucket = {
          flat.narrow(0, at, std::min(per, flat.numel() - at))};
      works.push_back(group_->allreduce(bucket));
      if (flat.numel() == 0) break;
    }
    return works;
  }

  // Waits for every bucket of one sum, within one timeout.
  absl::Status AwaitAll(
      const std::vector<c10::intrusive_ptr<c10d::Work>>& works,
      const char* what) {
    const absl::Time start = absl::Now();
    for (const auto& work : works) {
      FUSIONRL_RETURN_IF_ERROR(Await(work, what, start));
    }
    return absl::OkStatus();
  }

  // FailedPrecondition once a collective was abandoned.
  absl::Status Usable() const {
    if (!pending_) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "gloo group (rank ", rank_, " of ", world_,
        ") was abandoned in an earlier collective; form a new one"));
  }

  absl::Status Failed(const char* what, const std::exception& e) const {
    return absl::UnavailableError(absl::StrCat(what, " (rank ", rank_, " of ",
                                               world_, ") failed: ", e.what()));
  }

  // The tensors as one flat buffer (a view when there is one contiguous
  // tensor), and back.
  static at::Tensor Flat(const std::vector<at::Tensor>& tensors) {
    if (tensors.size() == 1 && tensors[0].is_contiguous()) {
      return tensors[0].view({-1});
    }
    std::vector<at::Tensor> parts;
    parts.reserve(tensors.size());
    for (const auto& t : tensors) parts.push_back(t.reshape({-1}));
    return at::cat(parts);
  }
  static void CopyBack(const at::Tensor& flat,
                       std::vector<at::Tensor>& tensors) {
    if (tensors.size() == 1 && tensors[0].is_contiguous() &&
        tensors[0].data_ptr() == flat.data_ptr()) {
      return;  // summed in place
    }
    int64_t offset = 0;
    for (auto& t : tensors) {
      const int64_t n = t.numel();
      t.copy_(flat.narrow(0, offset, n).view_as(t));
      offset += n;
    }
  }

  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  int rank_;
  int world_;
  absl::Duration timeout_;
  std::function<absl::Status()> probe_;
  // A collective given up on while it still ran (see ~GlooGradientSync).
  c10::intrusive_ptr<c10d::Work> pending_;
  const int64_t bucket_bytes_;
  // Asynchronous sums started and not waited for yet (their buckets), by
  // ticket.
  std::map<int64_t, std::vector<c10::intrusive_ptr<c10d::Work>>> started_;
  int64_t next_ticket_ = 0;
};

// Gloo's device for a group that spans machines: the interface named by
// GLOO_SOCKET_IFNAME (as torch.distributed reads it), else the address the
// host name resolves to (c10d's default; loopback when it resolves there).
std::shared_ptr<::gloo::transport::Device> NetworkDevice() {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
      ifname != nullptr && *ifname != '\0') {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// One Gloo thread on `device` (default: loopback, for groups inside this
// machine).
c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> GlooOptions(
    absl::Duration timeout,
    std::shared_ptr<::gloo::transport::Device> device = nullptr) {
  auto options = c10d::ProcessGroupGloo::Options::create(ToChrono(timeout));
  options->devices.push_back(
      device != nullptr
          ? std::move(device)
          : c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  options->threads = 1;
  return options;
}

}  // namespace

absl::StatusOr<int64_t> GradientSync::StartAllReduceSum(at::Tensor flat) {
  std::vector<at::Tensor> t = {std::move(flat)};
  FUSIONRL_RETURN_IF_ERROR(AllReduceSum(t));
  return int64_t{0};
}

absl::Status GradientSync::WaitAllReduceSum(int64_t) {
  return absl::OkStatus();
}

absl::Status GradientSync::Broadcast(std::vector<at::Tensor>&, int) {
  return absl::UnimplementedError("this GradientSync does not broadcast");
}

absl::StatusOr<at::Tensor> GradientSync::AllToAll(
    const at::Tensor& input, const std::vector<int64_t>& send_rows,
    const std::vector<int64_t>& recv_rows) {
  return absl::UnimplementedError(
      "this gradient sync cannot exchange rows (all-to-all): expert "
      "parallelism needs a c10d group");
}

absl::Status SumAcrossRanks(GradientSync* sync, std::vector<double>& values) {
  if (sync == nullptr || sync->world_size() == 1 || values.empty()) {
    return absl::OkStatus();
  }
  std::vector<at::Tensor> t = {at::tensor(values, at::kDouble)};
  absl::Status status = sync->AllReduceSum(t);
  if (!status.ok()) return status;
  auto acc = t[0].accessor<double, 1>();
  for (size_t i = 0; i < values.size(); ++i) values[i] = acc[i];
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::unique_ptr<GradientSync>>> MakeLocalGlooGroup(
    int world_size, absl::Duration timeout, int64_t bucket_bytes) {
  if (world_size < 1) {
    return absl::InvalidArgumentError("gloo group: world_size must be >= 1");
  }
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(ToChrono(timeout));
  // Ranks rendezvous through the store, so they must be constructed
  // concurrently.
  std::vector<std::future<c10::intrusive_ptr<c10d::ProcessGroupGloo>>> pending;
  for (int r = 0; r < world_size; ++r) {
    pending.push_back(
        std::async(std::launch::async, [store, r, world_size, timeout] {
          return c10::make_intrusive<c10d::ProcessGroupGloo>(
              store, r, world_size, GlooOptions(timeout));
        }));
  }
  std::vector<std::unique_ptr<GradientSync>> group;
  std::string error;
  for (int r = 0; r < world_size; ++r) {
    try {
      group.push_back(std::make_unique<GlooGradientSync>(
          pending[r].get(), r, world_size, timeout, nullptr, bucket_bytes));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!error.empty()) {
    return absl::UnavailableError(
        absl::StrCat("gloo group of ", world_size, " ranks: ", error));
  }
  return group;
}

absl::StatusOr<std::unique_ptr<GradientSync>> MakeTcpGlooGroup(
    const std::string& host, int port, int rank, int world_size,
    absl::Duration timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gloo group: rank ", rank, " is not in [0, ", world_size, ")"));
  }
  try {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(port);
    opts.isServer = rank == 0;
    opts.numWorkers = world_size;
    opts.waitWorkers = true;
    opts.timeout = ToChrono(timeout);
    auto store = c10::make_intrusive<c10d::TCPStore>(host, opts);
    auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(
        store, rank, world_size, GlooOptions(timeout));
    return std::unique_ptr<GradientSync>(
        new GlooGradientSync(group, rank, world_size, timeout));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "gloo group rank ", rank, " via ", host, ":", port, ": ", e.what()));
  }
}

absl::StatusOr<std::unique_ptr<GradientSync>> MakeStoreGlooGroup(
    c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
    absl::Duration timeout, std::function<absl::Status()> probe) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gloo group: rank ", rank, " is not in [0, ", world_size, ")"));
  }
  try {
    auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(
        std::move(store), rank, world_size,
        GlooOptions(timeout, NetworkDevice()));
    return std::unique_ptr<GradientSync>(new GlooGradientSync(
        std::move(group), rank, world_size, timeout, std::move(probe)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo group rank ", rank, " of ",
                                               world_size, ": ", e.what()));
  }
}

namespace internal {

bool WaitSlice(const c10::intrusive_ptr<c10d::Work>& work,
               absl::Duration slice) {
  try {
    work->wait(ToChrono(slice));
    return true;
  } catch (const std::exception&) {
    if (!work->isCompleted()) return false;  // still running
  }
  // Completed, maybe after this slice's wait had given up: wait again,
  // which returns at once or throws the collective's own error.
  work->wait();
  return true;
}

}  // namespace internal

}  // namespace fusionrl
