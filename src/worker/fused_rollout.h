// FusedRollout: the rollout thread of a card (RL Fusion, placement.mode
// fused; also the rollout card of placement.mode disaggregated).
//
// The thread samples the coming steps' prompt groups from a read-only
// snapshot of the policy while the card's main thread trains the live
// weights. After every committed step the trainer publishes its weights
// (one copy); the thread takes them into its snapshot before its next
// sampling round (one more copy), only when they are newer.
//
// Admission is StaleSync's policy-lag rule (PolicyLagRule, core/stalesync.h,
// per step): the i-th step after a reset starts only once the published
// version is at least v0 + i - s (v0: the trainer's version at the reset),
// so every sample is trained with staleness <= s. The trainer checks it
// again (StalenessFilter).
//
// Which version samples the step (stalesync.rollout_version): lagged =
// exactly max(v0, v0 + i - s), or with steps_per_version m > 1 the version
// of the last step of the i-th step's block of m
// (PolicyLagRule::LaggedSampleVersion), so the versions follow from the
// config and not from timing (the thread
// keeps the published versions it will still need: one copy when it is
// ahead of the trainer, at most s + 1 when the trainer waits for it);
// newest = the newest published one.
//
// Just in time (newest with Options::just_in_time; rollout_version jit):
// the i-th step waits for version v0 + i - d instead of v0 + i - s, d in
// 1..s the fewest training steps predicted to cover one step's rollout:
// ceil(1.2 x rollout seconds a step / training seconds a step), both the
// card's own moving averages (a step's rollout: its round's wall time per
// step; a training step: from Take() to the next Publish()), d = s until
// both are measured. It samples from the newest version then, so
// staleness is what overlap needs, never above s. Timing decides d, as it
// decides newest's versions.
//
// Rounds of several steps (max_steps_per_round > 1): when the steps after
// the next one are admitted too and sample from the same version (lagged:
// the first s + 1 steps after a reset all sample from v0, or with
// steps_per_version m > 1 each block of m steps shares one; newest: every
// admitted step samples from the newest version), the thread samples them
// in one engine call, where a finished sequence's slot takes the next
// waiting one of the same or a later step (continuous batching across
// steps, GroupSampler::SampleSteps). Each step's batch is handed over as
// soon as its sequences are done, and equals what a round of its own would
// have sampled. Steps that sample from different versions are never mixed:
// a batch holds the samples of exactly one policy version.
//
// Partial rollout (partial_rollout_tokens N > 0, lagged): token k of a
// response of step t is sampled by the version that samples step
// t + min(k / N, s - 1). A round stops a response where that version
// changes (a newer one than the round's) and keeps the step's batch aside
// (carried_) with the response unfinished; the round of the newer version
// continues it (re-prefilled, the same sampling keys) beside its own
// steps' responses, and hands the step over once every response is done.
// So a long tail decodes beside the next step's responses instead of alone.
// Which version samples which token follows from the config, not timing.
//
// Predictions: the thread samples base_groups advanced by prompts_per_step
// per step (the controller's plan when nothing fails). A plan that differs
// (the first step, a replanned attempt, a rollback) resets the thread: what
// it sampled is dropped and it starts over from the plan.
//
// With max_policy_lag 0 and Options::synchronous_on_caller, Take() samples
// the step itself (nothing can overlap at s = 0) and no thread is started.
//
// Checkpoints (lagged): Pending() hands out the batches sampled from
// versions older than the checkpoint's, with the frame; Restore() continues
// from them after a resume (worker/step/rollout_prefetch.h).
//
// Thread safety: Publish/Take/Reset/Stop are called by the card's main
// thread; the rollout thread is internal. Every shared field is guarded by
// one mutex.
#ifndef FUSIONRL_WORKER_FUSED_ROLLOUT_H_
#define FUSIONRL_WORKER_FUSED_ROLLOUT_H_

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/stalesync.h"
#include "worker/step/group_sampler.h"
#include "worker/step/rollout_prefetch.h"
#include "worker/work_client.h"

namespace fusionrl {

class PolicyModel;
class RolloutEngine;

class FusedRollout {
 public:
  // Samples the groups of `steps` (one or more consecutive steps) for card
  // `rank` with `engine`, whose weights are `version`, calling `deliver`
  // once for each step's batch (GroupSampler::SampleSteps). An error ends
  // the round.
  using SampleFn = std::function<absl::Status(
      RolloutEngine& engine, const std::vector<StepGroups>& steps, int rank,
      int64_t version, const GroupSampler::DeliverFn& deliver,
      const GroupSampler::SegmentEndFn& segment_end)>;

  struct Options {
    int64_t max_policy_lag = 0;  // s
    bool lagged = true;          // stalesync.rollout_version
    bool just_in_time = false;   // jit (with lagged false; see above)
    // Lagged: consecutive steps that sample from one version
    // (stalesync.steps_per_version, PolicyLagRule::LaggedSampleVersion).
    int steps_per_version = 1;
    int prompts_per_step = 1;  // the job's, to advance predicted groups
    int rollout_threads = 1;   // intra-op threads of the rollout thread
    // At most this many steps sampled in one engine call (see above); 1 =
    // one step per round.
    int max_steps_per_round = 1;
    // Partial rollout (see above; lagged, max_policy_lag >= 2): tokens per
    // segment, 0 = off.
    int64_t partial_rollout_tokens = 0;
    // Each sampling round runs on a thread of its own that ends with the
    // round. A round that borrows the trainer's threads grows an OpenMP
    // team, and libgomp keeps a thread's team until the thread ends; while
    // its teams hold more threads than the machine has cores, every OpenMP
    // thread of the process gives up spin-waiting at once, which made the
    // trainer's small parallel regions 20% slower (docs/BENCHMARKS.md "RL
    // Fusion: where the fused trainer's time went"). Not for synchronous
    // rounds, which run on the caller's thread and its team.
    bool round_on_own_thread = false;
    // Synchronous (max_policy_lag 0): no step can be sampled before the
    // trainer has published the weights of the step before it, so nothing
    // can overlap; Take() samples the step on the calling thread, from the
    // snapshot, instead of waking a thread that would (the same samples,
    // without the hand-over and a second OpenMP team).
    bool synchronous_on_caller = false;
    int64_t snapshot_version = 0;  // the policy version `snapshot` holds
    // How long Take() waits for a batch.
    absl::Duration timeout = absl::Seconds(300);
    // Fault injection (tests): steps before this one are sampled without
    // taking published weights into the snapshot. Admission still follows
    // the published version, so with lag s the (s+1)-th step after a
    // reset is sampled over the lag: the trainer's StalenessFilter must
    // regenerate or drop it. 0: off.
    int64_t freeze_snapshot_before_step = 0;
  };

  // `snapshot` is the rollout's copy of the policy and `engine` samples
  // from it. `on_sampled(seconds)` is called after every sampling round
  // (busy-time counters). `clock` borrowed.
  FusedRollout(std::unique_ptr<PolicyModel> snapshot,
               std::unique_ptr<RolloutEngine> engine, Options options,
               SampleFn sample, std::function<void(double)> on_sampled,
               const Clock& clock);
  ~FusedRollout();  // Stop()

  FusedRollout(const FusedRollout&) = delete;
  FusedRollout& operator=(const FusedRollout&) = delete;

  // Publishes `weights` (copied) as policy version `version` and, the first
  // time, starts the thread.
  void Publish(const std::vector<at::Tensor>& weights, int64_t version);

  // The batch of `plan` (its step and groups), waiting for the thread;
  // resets the predictions when the plan is not what they said.
  // DeadlineExceeded after `timeout`; the thread's error if it failed.
  absl::StatusOr<RolloutBatch> Take(const StepPlan& plan);

  // Forgets every prediction and sampled batch (after a rollback); the
  // next Take() starts over.
  void Reset();

  // Lagged only, after the trainer reached version `version` at the end of
  // step `step`: waits for the batches of the steps after `step` that
  // sample from versions below `version` (a resume from that checkpoint
  // could not sample them again) and returns them with the frame (fields
  // checkpoint_step and weights_crc32c left for the caller). Partial
  // rollout: a batch whose unfinished responses continue from `version` or
  // newer is returned as it stands (the resume continues them); one that
  // continues from an older version is waited for.
  // nullopt without a frame (nothing taken since the last reset) or with
  // rollout_version newest. DeadlineExceeded after `timeout`.
  absl::StatusOr<std::optional<RolloutPrefetch>> Pending(int64_t step,
                                                         int64_t version);

  // Continues the pipeline of `saved` (a checkpoint's): its batches are
  // taken first, and later steps sample from the versions its frame says.
  // Call after the first Publish() of the checkpoint's version and before
  // the first Take().
  void Restore(RolloutPrefetch saved);

  // Stops and joins the thread (idempotent).
  void Stop();

  // Whether Take() samples on the calling thread (see Options).
  bool synchronous_on_caller() const {
    return options_.synchronous_on_caller && options_.max_policy_lag == 0;
  }
  // Whether the thread is sampling right now (thread-budget sharing).
  bool sampling() const { return sampling_.load(); }
  // The step the thread waits to be admitted (a newer published version),
  // or -1 (tests: admission observed as a state, not a pause).
  int64_t waiting_for_step() const ABSL_LOCKS_EXCLUDED(mu_);
  // How many times the thread took published weights into its snapshot
  // (the proof, in a step's record, that the rollout ran on the thread).
  int64_t snapshot_updates() const { return snapshot_updates_.load(); }

 private:
  // One sampling round of the thread: what NextRound() hands out under the
  // lock, Deliver() takes each step's batch of, and EndRound() closes.
  struct Round {
    // Carried steps (partial rollout) first, then consecutive new ones.
    std::vector<StepGroups> steps;
    uint64_t generation = 0;
    int rank = 0;
    int64_t version = 0;
    // The frame the round's segment ends follow.
    PolicyLagRule rule;
    int64_t lag = 0;  // the admission lag its steps were admitted with
  };

  void Loop();
  // Waits until the next step may start, brings the snapshot to the
  // version it samples from, and says what to sample; nullopt once
  // stopping.
  // With `wait` false (synchronous rounds) it does not wait: nullopt when
  // the next step is not admitted.
  std::optional<Round> NextRound(bool wait = true) ABSL_LOCKS_EXCLUDED(mu_);
  // Samples `round` and ends it (the thread's loop body); false when the
  // thread must end.
  bool RunRound(const Round& round) ABSL_LOCKS_EXCLUDED(mu_);
  // Hands the sampled batch of one of the round's steps over (dropped if a
  // reset came meanwhile); `last`: the round's last one.
  void Deliver(const Round& round, int64_t step, RolloutBatch batch, bool last)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the round: moves on past its steps, or records `status` (or a step
  // it never delivered) as the thread's error; false when the thread must
  // end.
  bool EndRound(const Round& round, absl::Status status, size_t delivered)
      ABSL_LOCKS_EXCLUDED(mu_);
  void ResetLocked(int64_t base_step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether step `step` of the frame may start now (the rule at the
  // published version, with AdmitLagLocked()), and the version it samples
  // from (lagged: the rule's, at least v0; newest: the newest).
  bool AdmittedLocked(int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The lag admission uses now: s, or just in time the predicted d.
  int64_t AdmitLagLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t SampleVersionLocked(int64_t step) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops published versions no coming round samples from.
  void PruneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Partial rollout: where a round stops a response of `step` that holds
  // `tokens` tokens, the first segment start whose version
  // (PolicyLagRule::TokenVersion in the round's frame) is not the round's
  // (INT64_MAX: it runs to its end).
  int64_t SegmentEnd(const Round& round, int64_t step, int64_t tokens) const;
  // The version a carried batch continues with.
  int64_t CarriedVersionLocked(int64_t step, const RolloutBatch& batch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const SampleFn sample_;
  const std::function<void(double)> on_sampled_;
  const Clock& clock_;
  std::atomic<bool> sampling_{false};
  std::atomic<int64_t> snapshot_updates_{0};

  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  // The rollout thread reads these without the lock while it samples; the
  // main thread never touches them after construction.
  std::unique_ptr<PolicyModel> snapshot_;
  std::unique_ptr<RolloutEngine> engine_;
  int64_t snapshot_version_ ABSL_GUARDED_BY(mu_) = -1;
  // Published weights by version (newest: the newest only).
  std::map<int64_t, std::vector<at::Tensor>> published_ ABSL_GUARDED_BY(mu_);
  int64_t published_version_ ABSL_GUARDED_BY(mu_) = -1;
  // The frame: base_groups_ at rule_.base_step, each group index advancing
  // by prompts_per_step per step; versions counted from rule_.frame_version
  // (v0), steps admitted and sampled by rule_ (the one policy-lag rule).
  std::vector<uint64_t> base_groups_ ABSL_GUARDED_BY(mu_);
  PolicyLagRule rule_ ABSL_GUARDED_BY(mu_);
  int rank_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped on every reset
  int64_t next_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, RolloutBatch> ready_ ABSL_GUARDED_BY(mu_);
  // Partial rollout: steps whose batch has unfinished responses; and each
  // such batch as it was when a round took it, by step and the round's
  // version (Pending() saves the state before the round of its version, so
  // a resume decodes the rounds the uninterrupted run decoded).
  std::map<int64_t, RolloutBatch> carried_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::map<int64_t, RolloutBatch>> entered_
      ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  // Time the thread waited on the gate since its last delivered batch.
  double gate_wait_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  // Just in time: moving averages of a step's rollout and training wall
  // seconds (0: not measured yet), and when the trainer last took a batch.
  double rollout_step_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  double train_step_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time taken_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t waiting_for_step_ ABSL_GUARDED_BY(mu_) = -1;
  std::thread thread_;  // main thread only
};

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_FUSED_ROLLOUT_H_
