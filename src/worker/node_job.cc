#include "worker/node_job.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/collectives/grad_sync.h"
#include "fusionrl/config.h"
#include "spdlog/spdlog.h"
#include "worker/card_runner.h"
#include "worker/controller_store.h"
#include "worker/plan_rendezvous.h"

namespace fusionrl {

absl::Status RunNodeJob(const NodeContext& node, const Assignment& assignment) {
  const std::shared_ptr<const JobConfig>& config = assignment.config;
  auto report_setup_failure = [&](const absl::Status& status) {
    StepReport report;
    report.job_id = assignment.job_id;
    report.node_id = node.node_id;
    report.error = status;
    node.client->FinishStep(report, absl::ZeroDuration()).IgnoreError();
    return status;
  };
  if (config == nullptr) {
    return report_setup_failure(
        !assignment.config_error.ok()
            ? assignment.config_error
            : absl::InvalidArgumentError("assignment without a job config"));
  }
  std::vector<std::unique_ptr<CardCounters>>& cards_of_node = *node.cards;
  const int assigned = static_cast<int>(assignment.card_indices.size());
  const int rollout_cards = assignment.rollout_cards;
  if (assigned < 1 || assigned > static_cast<int>(cards_of_node.size()) ||
      rollout_cards < 0 || rollout_cards >= assigned) {
    return report_setup_failure(absl::InvalidArgumentError(absl::StrCat(
        "assignment uses ", assigned, " card(s), ", rollout_cards,
        " of them for rollout only; this node has ", cards_of_node.size())));
  }
  const absl::Duration timeout =
      absl::Seconds(config->run.collective_timeout_seconds);
  // The cards that train are the local ranks; disaggregated rollout cards
  // are served by a rollout thread of each training card they feed.
  const int cards = assigned - rollout_cards;
  std::vector<std::unique_ptr<GradientSync>> local;
  if (cards > 1) {
    auto group = MakeLocalGlooGroup(cards, timeout);
    if (!group.ok()) return report_setup_failure(group.status());
    local = *std::move(group);
  }
  // Expert parallelism: each run of E consecutive training cards of the
  // job (card i is the job's card offset + i; E divides a super node's
  // cards, so no run crosses super nodes) holds one policy's expert shards,
  // connected by a group of their own: a local Gloo group where the run's
  // cards are all this node's, a group formed through the controller's
  // store where it spans nodes (worker processes).
  const int ep = config->placement.expert_parallel;
  const int offset = assignment.train_rank_offset;
  std::vector<bool> experts_span_nodes(cards, false);
  // Forms the expert groups of this node's cards into `groups`, those
  // spanning nodes under the store prefix `prefix`<group>/.
  auto form_expert_groups =
      [&](const std::string& prefix,
          std::vector<std::unique_ptr<GradientSync>>& groups) -> absl::Status {
    groups.resize(cards);
    std::vector<absl::Status> formed(cards);
    std::vector<std::thread> forming;
    absl::Status local_error;
    for (int r = 0; r < cards && local_error.ok();) {
      const int group = (offset + r) / ep;
      const int first = group * ep - offset;  // local index of its rank 0
      const int end = first + ep;
      if (first >= 0 && end <= cards) {
        auto local_group = MakeLocalGlooGroup(ep, timeout);
        if (!local_group.ok()) {
          local_error = local_group.status();  // after the joins below
          break;
        }
        for (int i = 0; i < ep; ++i) {
          groups[first + i] = std::move((*local_group)[i]);
        }
        r = end;
        continue;
      }
      // The group spans nodes: every local member joins it at once (the
      // rendezvous waits for all E).
      for (int i = r; i < std::min(end, cards); ++i) {
        experts_span_nodes[i] = true;
        forming.emplace_back([&, i, group] {
          auto joined = FormJobGroup(
              node.client, assignment.job_id, node.node_id,
              absl::StrCat(prefix, group, "/"), (offset + i) % ep, ep, timeout);
          if (joined.ok()) {
            groups[i] = *std::move(joined);
          } else {
            formed[i] = joined.status();
          }
        });
      }
      r = std::min(end, cards);
    }
    for (std::thread& t : forming) t.join();
    if (!local_error.ok()) return local_error;
    if (!forming.empty() && config->placement.super_nodes > 1 &&
        config->stalesync.max_clock_skew > 0) {
      // Each node of a skewed job runs its own clock; a group spanning
      // nodes would tie theirs at every exchange.
      return absl::InvalidArgumentError(absl::StrCat(
          "placement.expert_parallel is ", ep, " but ", node.node_id, " holds ",
          cards,
          " card(s) of its super node: an expert group spanning worker "
          "processes is not built for StaleSync across super nodes "
          "(stalesync.max_clock_skew > 0); give each worker a multiple of ",
          ep, " cards"));
    }
    for (int i = 0; i < cards; ++i) {
      if (formed[i].ok()) continue;
      return absl::Status(
          formed[i].code(),
          absl::StrCat("placement.expert_parallel: ", node.node_id, " card ", i,
                       " could not join expert group ", (offset + i) / ep,
                       " (it spans worker processes): ", formed[i].message()));
    }
    return absl::OkStatus();
  };
  std::vector<std::unique_ptr<GradientSync>> experts;
  // Fused cards sampling from their shards (expert_sampling shard): the
  // rollout thread exchanges beside the trainer, over a second group of
  // the same cards.
  std::vector<std::unique_ptr<GradientSync>> rollout_experts;
  if (ep > 1) {
    absl::Status s = form_expert_groups("experts/", experts);
    if (s.ok() && config->placement.mode == PlacementMode::kFused &&
        config->placement.expert_sampling == ExpertSampling::kShard) {
      s = form_expert_groups("rollout-experts/", rollout_experts);
    }
    if (!s.ok()) return report_setup_failure(s);
  }
  auto counters_of = [&cards_of_node](int index) {
    return cards_of_node[std::min<size_t>(index, cards_of_node.size() - 1)]
        .get();
  };
  auto device_of = [&node, &config](int index) {
    // A node of several GPUs: card i runs on cuda:<its index>.
    return node.device == "cuda" && config->device == "cuda"
               ? absl::StrCat("cuda:", index)
               : config->device;
  };
  const bool fused = config->placement.mode == PlacementMode::kFused;
  for (int r = 0; r < assigned; ++r) {
    counters_of(assignment.card_indices[r])->role =
        r < rollout_cards   ? CardRole::kRollout
        : rollout_cards > 0 ? CardRole::kTrain
        : fused             ? CardRole::kFused
                            : CardRole::kColocated;
  }
  spdlog::info("{}: running {} on {} card(s){}", node.node_id,
               assignment.job_id, assigned,
               rollout_cards > 0 ? absl::StrCat(" (", rollout_cards,
                                                " rollout, ", cards, " train)")
                                 : std::string());
  PlanRendezvous::Options ro;
  ro.job_id = assignment.job_id;
  ro.node_id = node.node_id;
  ro.local_cards = cards;
  ro.timeout = timeout;
  PlanRendezvous rendezvous(*node.client, ro, node.stopping, *node.clock);
  std::vector<absl::Status> status(cards);
  std::vector<CardJob> jobs(cards);
  for (int r = 0; r < cards; ++r) {
    const int index = assignment.card_indices[rollout_cards + r];
    CardJob& job = jobs[r];
    job.client = node.client;
    job.rendezvous = &rendezvous;
    job.clock = node.clock;
    job.node_id = node.node_id;
    job.super_node = node.super_node;
    job.job_id = assignment.job_id;
    job.config = config.get();
    job.device = device_of(index);
    job.resume_checkpoint = assignment.resume_checkpoint;
    job.local_rank = r;
    job.local_cards = cards;
    job.assigned_cards = assigned;
    job.rollout_cards = rollout_cards;
    job.threads = node.threads > 0 ? node.threads : config->num_threads;
    job.debug_step_delay = node.debug_step_delay;
    job.debug_checkpoint_delay = node.debug_checkpoint_delay;
    if (rollout_cards > 0) {
      const int rollout_index = assignment.card_indices[r % rollout_cards];
      job.rollout_counters = counters_of(rollout_index);
      job.rollout_device = device_of(rollout_index);
      job.rollout_counters->active = true;
    }
    job.local = cards > 1 ? local[r].get() : nullptr;
    job.experts = ep > 1 ? experts[r].get() : nullptr;
    job.rollout_experts =
        rollout_experts.empty() ? nullptr : rollout_experts[r].get();
    job.experts_span_nodes = experts_span_nodes[r];
    job.job_rank = offset + r;
    job.counters = counters_of(index);
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < cards; ++r) {
    threads.emplace_back([&status, &rendezvous, &jobs, r] {
      const CardJob& job = jobs[r];
      try {
        status[r] = RunCard(job);
      } catch (const c10::Error& e) {
        status[r] = absl::InternalError(
            absl::StrCat("card ", r, ": ", e.what_without_backtrace()));
      } catch (const std::exception& e) {
        status[r] =
            absl::InternalError(absl::StrCat("card ", r, ": ", e.what()));
      }
      status[r] = WithExpertGroupNote(job, std::move(status[r]));
      // Card 0 hands out the plans: release the cards waiting for one.
      if (r == 0 && !status[r].ok()) rendezvous.Fail(status[r]);
      job.counters->active = false;
      job.counters->SetMemory(nullptr);
      if (job.rollout_counters != nullptr) {
        job.rollout_counters->active = false;
        job.rollout_counters->SetMemory(nullptr);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < cards; ++r) {
    if (!status[r].ok()) {
      // The job fails with the card's error (a repeat report is ignored by
      // the controller once the job has failed).
      if (!absl::IsCancelled(status[r])) {
        report_setup_failure(status[r]).IgnoreError();
      }
      return absl::Status(status[r].code(),
                          absl::StrCat(assignment.job_id, " card ", r, ": ",
                                       status[r].message()));
    }
  }
  spdlog::info("{}: {} done", node.node_id, assignment.job_id);
  return absl::OkStatus();
}

}  // namespace fusionrl
