#include "worker/hier_sync.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace fusionrl {
namespace {

// Outcome codes of the cross-node part, shared with the node's other cards.
constexpr double kOk = 0;
constexpr double kAborted = 1;
constexpr double kFailed = 2;

// The tensors as one flat host tensor of `dtype`.
at::Tensor Flatten(const std::vector<at::Tensor>& tensors,
                   at::ScalarType dtype) {
  std::vector<at::Tensor> parts;
  parts.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    parts.push_back(t.detach().reshape({-1}).to(at::kCPU, dtype));
  }
  return at::cat(parts).contiguous();
}

// Copies consecutive slices of `flat` back into `tensors`.
void Unflatten(const at::Tensor& flat, std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (at::Tensor& t : tensors) {
    const int64_t n = t.numel();
    t.copy_(flat.narrow(0, offset, n).view(t.sizes()));
    offset += n;
  }
}

}  // namespace

absl::Status HierarchicalSync::ShareFromCardZero(at::Tensor& flat,
                                                 double outcome,
                                                 const std::string& error,
                                                 const char* what) {
  if (local_ != nullptr && local_->world_size() > 1) {
    // Hand card 0's result (and the outcome) to the node's other cards.
    if (local_rank_ != 0) flat.zero_();
    std::vector<at::Tensor> share = {flat, at::tensor({outcome}, at::kDouble)};
    absl::Status s = local_->AllReduceSum(share);
    if (!s.ok()) return s;
    flat = share[0];
    outcome = share[1].item<double>();
  }
  if (outcome == kAborted) {
    return absl::AbortedError(
        local_rank_ == 0
            ? error
            : absl::StrCat("the node's ", what,
                           " was aborted (a node was lost, the data plane "
                           "failed or the job ended)"));
  }
  if (outcome != kOk) {
    return absl::UnavailableError(
        local_rank_ == 0
            ? error
            : absl::StrCat("the node's ", what, " failed on card 0"));
  }
  return absl::OkStatus();
}

HierarchicalSync::HierarchicalSync(GradientSync* local, int local_rank,
                                   CrossNodeReduce reduce,
                                   CrossNodeExchange exchange,
                                   CrossNodeGroupFactory form_group)
    : local_(local),
      local_rank_(local_rank),
      reduce_(std::move(reduce)),
      exchange_(std::move(exchange)),
      form_group_(std::move(form_group)) {
  rank_ = local_rank;
  world_ = local != nullptr ? local->world_size() : 1;
}

void HierarchicalSync::BeginAttempt(int rank, int world_size, int nodes,
                                    std::optional<DataPlane> data_plane) {
  rank_ = rank;
  world_ = world_size;
  nodes_ = nodes;
  round_ = 0;
  cross_node_seconds_ = 0;
  cross_node_bytes_ = 0;
  skewed_ = false;
  data_plane_ = data_plane;
  if (!data_plane_ || data_plane_->generation != cross_generation_) {
    DropCrossGroup();  // re-formed at the first sum of the new generation
  }
}

void HierarchicalSync::DropCrossGroup() {
  in_flight_.clear();
  cross_.reset();
  cross_generation_ = -1;
}

absl::Status HierarchicalSync::EnsureCrossGroup() {
  if (cross_ == nullptr) {
    if (!form_group_) {
      return absl::FailedPreconditionError(
          "the c10d data plane was asked for but no group can be formed");
    }
    absl::StatusOr<std::unique_ptr<GradientSync>> group =
        form_group_(data_plane_->generation, data_plane_->node_rank, nodes_);
    if (!group.ok()) {
      return absl::Status(group.status().code(),
                          absl::StrCat("forming the data plane's group: ",
                                       group.status().message()));
    }
    cross_ = *std::move(group);
    cross_generation_ = data_plane_->generation;
  }
  return absl::OkStatus();
}

absl::Status HierarchicalSync::CrossNodeAllReduce(at::Tensor& flat) {
  FUSIONRL_RETURN_IF_ERROR(EnsureCrossGroup());
  std::vector<at::Tensor> buffer = {flat};
  absl::Status s = cross_->AllReduceSum(buffer);
  if (!s.ok()) DropCrossGroup();  // broken: the next generation forms anew
  return s;
}

void HierarchicalSync::BeginSkewedStep(int64_t step, int64_t due_step,
                                       int nodes,
                                       std::optional<DataPlane> data_plane) {
  BeginAttempt(local_rank_, local_ != nullptr ? local_->world_size() : 1, nodes,
               data_plane);
  skewed_ = true;
  step_ = step;
  due_step_ = due_step;
  updates_received_ = 0;
  max_update_lag_ = 0;
}

absl::Status HierarchicalSync::LocalSum(std::vector<double>& values) {
  return SumAcrossRanks(local_, values);
}

absl::Status HierarchicalSync::AllReduceSum(std::vector<at::Tensor>& tensors) {
  const bool multi_card = local_ != nullptr && local_->world_size() > 1;
  if (multi_card) {
    absl::Status s = local_->AllReduceSum(tensors);
    if (!s.ok()) return s;
  }
  if (skewed_ || nodes_ <= 1 || tensors.empty()) return absl::OkStatus();

  bool all_float = true;
  for (const at::Tensor& t : tensors) {
    all_float = all_float && t.scalar_type() == at::kFloat;
  }
  at::Tensor flat = Flatten(tensors, all_float ? at::kFloat : at::kDouble);
  const int64_t round = round_++;
  const auto start = std::chrono::steady_clock::now();
  const size_t bytes = flat.numel() * flat.element_size();
  if (activity_) activity_("all-reduce", round);

  double outcome = kOk;
  std::string error;
  if (local_rank_ == 0 && data_plane_) {
    absl::Status s = CrossNodeAllReduce(flat);
    if (!s.ok()) {
      // Any failure of the data plane is the attempt's, never the job's:
      // the controller replans the step (and fails the job only after a
      // few such attempts in a row).
      outcome = kAborted;
      error = absl::StrCat("data plane, round ", round, ": ", s.message());
    }
  } else if (local_rank_ == 0) {
    std::string payload(static_cast<const char*>(flat.data_ptr()), bytes);
    absl::StatusOr<std::string> sum = reduce_(
        round, all_float ? ReduceDtype::kFloat32 : ReduceDtype::kFloat64,
        std::move(payload));
    if (sum.ok() && sum->size() == bytes) {
      std::memcpy(flat.data_ptr(), sum->data(), bytes);
    } else if (sum.ok()) {
      outcome = kFailed;
      error = absl::StrCat("cross-node round ", round, ": got ", sum->size(),
                           " bytes back, sent ", bytes);
    } else {
      outcome = sum.status().code() == absl::StatusCode::kAborted ? kAborted
                                                                  : kFailed;
      error = std::string(sum.status().message());
    }
  }
  FUSIONRL_RETURN_IF_ERROR(
      ShareFromCardZero(flat, outcome, error, "cross-node round"));
  if (activity_) activity_(nullptr, -1);
  cross_node_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  cross_node_bytes_ += static_cast<int64_t>(bytes);
  Unflatten(flat, tensors);
  return absl::OkStatus();
}

absl::Status HierarchicalSync::ReduceGradients(std::vector<at::Tensor>& grads) {
  if (!skewed_) return world_ > 1 ? AllReduceSum(grads) : absl::OkStatus();
  const bool multi_card = local_ != nullptr && local_->world_size() > 1;
  if (multi_card) {
    absl::Status s = local_->AllReduceSum(grads);
    if (!s.ok()) return s;
  }
  if (grads.empty()) return absl::OkStatus();
  for (const at::Tensor& t : grads) {
    if (t.scalar_type() != at::kFloat) {
      return absl::UnimplementedError(
          "StaleSync update exchange: gradients must be float32");
    }
  }
  at::Tensor flat = Flatten(grads, at::kFloat);
  const int64_t round = round_++;
  const auto start = std::chrono::steady_clock::now();
  const size_t bytes = flat.numel() * sizeof(float);
  if (activity_) activity_("update exchange", round);

  double outcome = kOk;
  std::string error;
  if (nodes_ <= 1) {
    // The only super node left (the others were lost): nothing to
    // exchange, the node's update is the whole update.
  } else if (local_rank_ == 0 && data_plane_) {
    absl::Status s = SkewedC10dExchange(flat, round);
    if (!s.ok()) {
      // Every sum in flight on the group is lost with it: the job rolls
      // back to its last weight sync.
      outcome = kAborted;
      error = absl::StrCat("StaleSync data plane, step ", step_, " round ",
                           round, ": ", s.message());
      DropCrossGroup();
    }
  } else if (local_rank_ == 0) {
    std::string payload(static_cast<const char*>(flat.data_ptr()), bytes);
    absl::StatusOr<std::vector<ReceivedUpdate>> got =
        exchange_
            ? exchange_(step_, round, due_step_, std::move(payload))
            : absl::FailedPreconditionError("no update exchange configured");
    if (got.ok()) {
      at::Tensor other = at::empty_like(flat);
      for (const ReceivedUpdate& u : *got) {
        if (u.payload.size() != bytes) {
          outcome = kFailed;
          error = absl::StrCat("update exchange at step ", step_, " round ",
                               round, ": an update of ", u.payload.size(),
                               " bytes, ours ", bytes);
          break;
        }
        std::memcpy(other.data_ptr(), u.payload.data(), bytes);
        flat.add_(other);
        ++updates_received_;
        max_update_lag_ = std::max(max_update_lag_, step_ - u.step);
      }
      flat.div_(static_cast<double>(nodes_));
      cross_node_bytes_ += static_cast<int64_t>(bytes * (1 + got->size()));
    } else {
      outcome = got.status().code() == absl::StatusCode::kAborted ? kAborted
                                                                  : kFailed;
      error = std::string(got.status().message());
    }
  }
  FUSIONRL_RETURN_IF_ERROR(
      ShareFromCardZero(flat, outcome, error, "update exchange"));
  if (activity_) activity_(nullptr, -1);
  cross_node_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  Unflatten(flat, grads);
  return absl::OkStatus();
}

absl::Status HierarchicalSync::SkewedC10dExchange(at::Tensor& flat,
                                                  int64_t round) {
  FUSIONRL_RETURN_IF_ERROR(EnsureCrossGroup());
  InFlight started{step_, round, flat.clone(), flat.clone(), 0};
  FUSIONRL_ASSIGN_OR_RETURN(started.ticket,
                            cross_->StartAllReduceSum(started.sum));
  in_flight_.push_back(std::move(started));
  cross_node_bytes_ += static_cast<int64_t>(flat.numel() * sizeof(float));
  // Apply the others' part of every sum due by now, oldest first.
  const std::pair<int64_t, int64_t> due{due_step_, round};
  while (!in_flight_.empty() &&
         std::make_pair(in_flight_.front().step, in_flight_.front().round) <=
             due) {
    InFlight& f = in_flight_.front();
    FUSIONRL_RETURN_IF_ERROR(cross_->WaitAllReduceSum(f.ticket));
    flat.add_(f.sum.sub_(f.own));
    updates_received_ += nodes_ - 1;
    max_update_lag_ = std::max(max_update_lag_, step_ - f.step);
    in_flight_.pop_front();
  }
  flat.div_(static_cast<double>(nodes_));
  return absl::OkStatus();
}

absl::Status HierarchicalSync::BroadcastFromLead(std::string& state,
                                                 int source) {
  if (!data_plane_) {
    return absl::FailedPreconditionError(
        "a weight broadcast needs the c10d data plane");
  }
  const bool lead_node = data_plane_->node_rank == 0;
  if (lead_node && source != 0) {
    // The lead node's card `source` hands its state to card 0, which
    // broadcasts it over the nodes' group.
    if (local_ == nullptr || source >= local_->world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("weight broadcast from card ", source, " of a node of ",
                       local_ ? local_->world_size() : 1));
    }
    std::vector<double> n = {
        local_rank_ == source ? static_cast<double>(state.size()) : 0.0};
    FUSIONRL_RETURN_IF_ERROR(LocalSum(n));
    at::Tensor b = at::empty({static_cast<int64_t>(n[0])}, at::kByte);
    if (local_rank_ == source) {
      std::memcpy(b.data_ptr(), state.data(), state.size());
    }
    std::vector<at::Tensor> v = {b};
    FUSIONRL_RETURN_IF_ERROR(local_->Broadcast(v, source));
    if (local_rank_ == 0) {
      state.assign(static_cast<const char*>(b.data_ptr()),
                   static_cast<size_t>(b.numel()));
    }
  }
  double outcome = kOk;
  std::string error;
  at::Tensor bytes;
  int64_t size = 0;
  if (local_rank_ == 0) {
    absl::Status s = EnsureCrossGroup();
    if (s.ok()) {
      std::vector<at::Tensor> n = {at::tensor(
          {static_cast<int64_t>(lead_node ? state.size() : 0)}, at::kLong)};
      s = cross_->Broadcast(n, 0);
      size = n[0].item<int64_t>();
    }
    if (s.ok()) {
      bytes = at::empty({size}, at::kByte);
      if (lead_node) std::memcpy(bytes.data_ptr(), state.data(), state.size());
      std::vector<at::Tensor> b = {bytes};
      s = cross_->Broadcast(b, 0);
    }
    if (!s.ok()) {
      outcome = kAborted;  // the job rolls back to its last sync
      error = absl::StrCat("weight broadcast: ", s.message());
      DropCrossGroup();
    }
  }
  if (local_ != nullptr && local_->world_size() > 1) {
    // The node's other cards learn the outcome and the size, then (off the
    // lead node) the bytes.
    std::vector<double> meta = {
        local_rank_ == 0 ? outcome : 0.0,
        local_rank_ == 0 ? static_cast<double>(size) : 0.0};
    FUSIONRL_RETURN_IF_ERROR(LocalSum(meta));
    outcome = meta[0];
    size = static_cast<int64_t>(meta[1]);
    if (outcome == kOk && !lead_node) {
      if (local_rank_ != 0) bytes = at::empty({size}, at::kByte);
      std::vector<at::Tensor> b = {bytes};
      FUSIONRL_RETURN_IF_ERROR(local_->Broadcast(b, 0));
    }
  }
  if (outcome != kOk) {
    const std::string what =
        local_rank_ == 0 ? error
                         : std::string("the node's weight broadcast failed");
    return outcome == kAborted ? absl::AbortedError(what)
                               : absl::UnavailableError(what);
  }
  if (!lead_node) {
    state.assign(static_cast<const char*>(bytes.data_ptr()),
                 static_cast<size_t>(size));
  }
  return absl::OkStatus();
}

}  // namespace fusionrl
