#include "engine/grad_sync.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <functional>
#include <future>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"

namespace fusionrl {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

class GlooGradientSync final : public GradientSync {
 public:
  GlooGradientSync(c10::intrusive_ptr<c10d::ProcessGroupGloo> group, int rank,
                   int world, absl::Duration timeout,
                   std::function<absl::Status()> probe = nullptr)
      : group_(std::move(group)),
        rank_(rank),
        world_(world),
        timeout_(timeout),
        probe_(std::move(probe)) {}

  ~GlooGradientSync() override {
    if (pending_) {
      // A collective this rank gave up on (its peer froze) still runs in
      // Gloo's thread until Gloo's own timeout; destroying the group now
      // would wait for it. Let a detached thread hold the group until then.
      std::thread([group = std::move(group_), work = std::move(pending_)] {
        try {
          work->wait();
        } catch (const std::exception&) {
        }
      }).detach();
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  absl::Status AllReduceSum(std::vector<at::Tensor>& tensors) override {
    if (tensors.empty()) return absl::OkStatus();
    if (pending_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "gloo group (rank ", rank_, " of ", world_,
          ") was abandoned in an earlier collective; form a new one"));
    }
    try {
      std::vector<at::Tensor> flat_parts;
      flat_parts.reserve(tensors.size());
      for (const auto& t : tensors) flat_parts.push_back(t.reshape({-1}));
      std::vector<at::Tensor> buffer = {at::cat(flat_parts)};
      auto work = group_->allreduce(buffer);
      if (absl::Status s = Await(work); !s.ok()) return s;
      int64_t offset = 0;
      for (auto& t : tensors) {
        const int64_t n = t.numel();
        t.copy_(buffer[0].narrow(0, offset, n).view_as(t));
        offset += n;
      }
    } catch (const std::exception& e) {
      // c10d reports a timed-out or broken peer as an exception.
      return absl::UnavailableError(absl::StrCat("gradient all-reduce (rank ",
                                                 rank_, " of ", world_,
                                                 ") failed: ", e.what()));
    }
    return absl::OkStatus();
  }

 private:
  // Waits for `work` (throws what c10d throws). Without a probe, one wait
  // of the group's timeout. With one, waits in slices and, once the
  // collective has taken longer than kProbeAfter, asks the probe after each
  // slice: an error from it abandons the collective (and the group) at
  // once, so a frozen peer holds this rank only until the controller has
  // declared it lost, not for the whole collective timeout.
  absl::Status Await(const c10::intrusive_ptr<c10d::Work>& work) {
    if (!probe_) {
      work->wait(ToChrono(timeout_));
      return absl::OkStatus();
    }
    constexpr absl::Duration kSlice = absl::Milliseconds(200);
    constexpr absl::Duration kProbeAfter = absl::Seconds(1);
    const absl::Time start = absl::Now();
    for (;;) {
      try {
        work->wait(ToChrono(kSlice));
        return absl::OkStatus();
      } catch (const std::exception&) {
        if (work->isCompleted()) throw;  // the collective itself failed
      }
      const absl::Duration waited = absl::Now() - start;
      if (waited >= timeout_) {
        pending_ = work;
        return absl::DeadlineExceededError(absl::StrCat(
            "all-reduce (rank ", rank_, " of ", world_,
            ") did not finish within ", absl::FormatDuration(timeout_)));
      }
      if (waited < kProbeAfter) continue;
      if (absl::Status s = probe_(); !s.ok()) {
        pending_ = work;
        return absl::Status(
            s.code(),
            absl::StrCat("all-reduce (rank ", rank_, " of ", world_,
                         ") abandoned after ", absl::FormatDuration(waited),
                         ": ", s.message()));
      }
    }
  }

  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  int rank_;
  int world_;
  absl::Duration timeout_;
  std::function<absl::Status()> probe_;
  // A collective given up on while it still ran (see ~GlooGradientSync).
  c10::intrusive_ptr<c10d::Work> pending_;
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
    int world_size, absl::Duration timeout) {
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
      group.push_back(std::make_unique<GlooGradientSync>(pending[r].get(), r,
                                                         world_size, timeout));
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

}  // namespace fusionrl
