// CardRunner: the class behind RunCard (worker/card_runner.h), one card's
// part of one job. Internal to worker/; its rooms are separate files:
//
//   card_runner.cc       the run loop: one handler per plan kind
//   card_setup.cc        the card's models, trainer and exchange; its rollout
//                        (the fused or disaggregated rollout thread, thread
//                        sharing and turns) built by its own factory
//   card_train_step.cc   one step: the batch, the staleness filter, the
//                        training step, the totals and the lead's record
//   card_weight_sync.cc  StaleSync across super nodes: sync points, roll-back
//                        and the weight sync
//   card_checkpoint.cc   the rollout's prefetch file and the end checkpoint
//
// Thread safety: one CardRunner per card thread.
#ifndef FUSIONRL_WORKER_CARD_RUNNER_IMPL_H_
#define FUSIONRL_WORKER_CARD_RUNNER_IMPL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/jobs/evaluate.h"
#include "engine/jobs/job_setup.h"
#include "worker/card_runner.h"
#include "worker/step/role_overlap.h"
#include "worker/step/step_snapshot.h"

namespace fusionrl {

class CardMemoryManager;
class CardTurns;
class FusedRollout;
class GroupSampler;
class HierarchicalSync;
class PolicyModel;
class RolloutEngine;
class Trainer;
struct RolloutBatch;
struct StepRecordParts;

class CardRunner {
 public:
  explicit CardRunner(const CardJob& job);
  ~CardRunner();  // stops the rollout thread

  CardRunner(const CardRunner&) = delete;
  CardRunner& operator=(const CardRunner&) = delete;

  absl::Status Run();

 private:
  // --- the run loop (card_runner.cc) ---
  // A plan of kind END (every card keeps its prefetch; card 0 writes the
  // last checkpoint if it is the lead) and of kind TRAIN (one attempt of a
  // step, its commit or roll-back). OnTrain returns the step to ask for
  // next.
  absl::Status OnEnd(StepPlan plan);
  absl::StatusOr<int64_t> OnTrain(const StepPlan& plan);
  // OnTrain's steps. An expert group spanning nodes needs the cards it
  // formed with (FailedPrecondition otherwise).
  absl::Status CheckExpertWorld(const StepPlan& plan);
  // Starts the step's exchange: synchronous, or StaleSync's across super
  // nodes (plan.exchange_updates).
  absl::Status BeginStep(const StepPlan& plan);
  // Card 0 tells the controller the attempt was aborted.
  void ReportAbort(const StepPlan& plan, const absl::Status& step);
  // The node's outcome of a trained step (`step`: this card's): card 0
  // reports it and learns whether it was committed; with several cards,
  // every card learns both, and one card's abort aborts them all.
  struct StepOutcome {
    absl::Status status;
    bool committed = false;
  };
  absl::StatusOr<StepOutcome> NodeOutcome(const StepPlan& plan,
                                          const StepReport& report,
                                          absl::Status step);
  // After a StaleSync step that went through: keeps its weight sync, and
  // publishes the committed step to the rollout. Returns the next step.
  absl::StatusOr<int64_t> AfterSkewedStep(const StepPlan& plan, bool committed);
  // An aborted or uncommitted synchronous step: restores the state the
  // cards had at its start. Returns the step, to be replanned.
  absl::StatusOr<int64_t> RollBack(const StepPlan& plan,
                                   std::optional<StepSnapshot>& snapshot,
                                   const absl::Status& step);
  absl::StatusOr<bool> Finish(const StepReport& report);
  void ReportFailure(const absl::Status& status, int64_t step, int attempt);
  StepReport NewReport(int64_t step, int attempt) const;
  void PublishToRollout();
  // What the card does now (heartbeats report it; docs/cluster.md#hangs).
  void Doing(std::string what);
  const JobConfig& config() const { return *job_.config; }

  // --- set-up (card_setup.cc) ---
  absl::Status Setup();
  // Setup's steps: expert parallelism's shard of the policy, the trainer
  // and the card's own rollout engine, the set-up logs (card 0), and the
  // card's memory books.
  absl::Status CutExpertShard();
  absl::Status MakeTrainerAndRollout();
  void LogPolicy() const;
  void LogExpertParallel() const;
  absl::Status BookMemory();
  // The card's exchange: gradients over the node's cards and the
  // attempt's nodes, or StaleSync's update exchange across super nodes.
  std::unique_ptr<HierarchicalSync> MakeSync();
  // Fused or disaggregated: the card's rollout thread, its snapshot and
  // engine, how it shares the card's threads with the trainer, and
  // whether the two take turns (worker/step/card_turns.h).
  absl::Status SetUpRolloutThread();
  // Its steps, over the parts of the thread being built: the thread shares
  // of the trainer and the rollout and the snapshot (fused or
  // disaggregated), the rollout's engine, the turns of the two roles, the
  // rollout borrowing the trainer's idle threads, and the thread itself.
  struct RolloutThreadParts;
  absl::Status SplitRolloutThreads(RolloutThreadParts& parts);
  void MakeRolloutThreadEngine(RolloutThreadParts& parts);
  void SetUpTurns(const RolloutThreadParts& parts);
  void ShareIdleTrainerThreads(RolloutThreadParts& parts);
  void StartRolloutThread(RolloutThreadParts& parts);

  // --- one step (card_train_step.cc) ---
  // One attempt of one step. Fills `report` (lead: metrics). Its steps in
  // order, over the attempt's StepRun: the evaluation before step 1, the
  // batch, the training step, the sums over the job's cards, the exchange
  // across super nodes, the card's own accounting, and the lead's report.
  absl::Status TrainStep(const StepPlan& plan, StepReport& report);
  struct StepRun;
  absl::Status EvaluateBefore(const StepPlan& plan, StepReport& report);
  absl::Status TakeBatch(const StepPlan& plan, StepRun& run);
  absl::Status TrainOnBatch(const StepPlan& plan, StepRun& run);
  // What this card trained, summed over the job's cards (run.totals).
  absl::Status SumTotals(const StepPlan& plan, StepRun& run);
  // The card's files of the step's checkpoint: its rollout's prefetch and
  // (expert parallelism) its shard's optimizer state.
  absl::Status SaveCardCheckpointFiles(const StepPlan& plan);
  // StaleSync across super nodes: the weight sync after the step, the
  // card's checkpoint files from the synced state, and what card 0 reports
  // of its super node.
  absl::Status SyncAcrossSuperNodes(const StepPlan& plan, StepRun& run,
                                    StepReport& report);
  // The step's time on the card: its turns, busy time and role split.
  void EndOnCard(StepRun& run);
  // The lead card: the step's record, the evaluation after it and its
  // checkpoint into `report`.
  absl::Status ReportAsLead(const StepPlan& plan, StepRun& run,
                            StepReport& report);
  // The record's parts; takes the exchange counters since the last record.
  StepRecordParts RecordParts(const StepPlan& plan, StepRun& run);
  // The step's batch: taken from the rollout thread or sampled here, then
  // over-stale groups regenerated or dropped. `wait_seconds`: the trainer
  // waiting for the thread; `thread_samples`: samples the thread sampled;
  // `over_stale`: samples over the lag before the filter.
  absl::StatusOr<RolloutBatch> StepBatch(const StepPlan& plan,
                                         double* wait_seconds,
                                         int64_t* thread_samples,
                                         int64_t* over_stale);
  // The colocated rollout of `groups` on this thread.
  absl::StatusOr<RolloutBatch> SampleHere(const std::vector<uint64_t>& groups,
                                          const StepPlan& plan);
  // Before a training step: carries out an optimizer offload the rollout
  // thread was granted, and brings the state back when it fits.
  absl::Status PrepareOptimizer();

  // --- StaleSync across super nodes (card_weight_sync.cc) ---
  // Before a step: keeps the weights every super node starts from (the
  // first step), and after a roll-back (plan.rollback_to_step, a new
  // attempt) restores those of the last committed weight sync and drops
  // the rollout's prefetched samples.
  absl::Status EnterSkewedStep(const StepPlan& plan);
  // Keeps this card's state after the weight sync of `step` (on the host),
  // dropping syncs after it and all but the newest before it.
  absl::Status KeepSyncPoint(int64_t step);
  // After a sync_weights step: the lead card publishes its weights and
  // optimizer state (through the controller's WeightService, or broadcast
  // over the c10d data plane), the cards of the other super nodes adopt
  // them. Returns the bytes this card sent or received.
  absl::StatusOr<int64_t> SyncWeights(const StepPlan& plan);

  // --- checkpoints (card_checkpoint.cc) ---
  // Fused or disaggregated with rollout_version lagged: writes what this
  // card's rollout sampled ahead of the checkpoint of `step`
  // (worker/step/rollout_prefetch.h).
  absl::Status SavePrefetch(int64_t step);
  // The same for the job's end checkpoint after `step` (once; a failure is
  // logged: the checkpoint stands, a resume samples afresh).
  void SaveEndPrefetch(int64_t step);
  // After a resume, before the first batch is taken: continues the rollout
  // pipeline the checkpoint's prefetch file of this card describes, or
  // says why the coming steps are sampled afresh.
  void RestorePrefetch(const StepPlan& plan);
  // Expert parallelism: the card of rank `rank` in the lead's group (the
  // lead is 0), for a checkpoint named `checkpoint` (none: "") of `step`:
  // shards 1..E-1 write their optimizer state for it
  // (engine/train/checkpoint.h), which the lead waits for and moves in.
  absl::Status SaveExpertShard(const std::string& checkpoint, int rank,
                               int64_t step);
  // The lead's checkpoint of a step (`dir` under output_dir/checkpoints).
  absl::Status WriteStepCheckpoint(const StepPlan& plan, int64_t step,
                                   std::string* dir);
  // The job's end checkpoint (and the Hugging Face export of a finished
  // job).
  absl::Status WriteEndCheckpoint(const StepPlan& plan, std::string* dir);
  // The checkpoint writer's fault-injection pause (debug_checkpoint_delay).
  std::function<void()> CheckpointPause() const;

  const CardJob& job_;
  const Clock& clock_;
  const absl::Duration timeout_;
  JobContext ctx_;
  std::unique_ptr<GroupSampler> sampler_;
  std::unique_ptr<PolicyModel> reference_;
  std::unique_ptr<HierarchicalSync> sync_;
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<RolloutEngine> rollout_;
  // LoRA: the merged view rollout_ and evaluation sample from (the policy
  // itself otherwise); SamplingPolicy() merges the current adapters in.
  std::unique_ptr<PolicyModel> merged_;
  // An expert group spanning nodes: the job's training cards at its first
  // step (0 before it); a later plan with other cards fails the job.
  int expert_world_ = 0;
  // Expert parallelism (placement.expert_parallel): the policy trains as a
  // shard of the experts (ctx_.policy). With expert_sampling gathered,
  // rollout, evaluation, export and the checkpoint's model.pt use this
  // model holding all of them, gathered from the card's expert group after
  // every step (GatherExperts, a collective of the group).
  std::unique_ptr<PolicyModel> gathered_;
  absl::Status GatherExperts();
  // expert_sampling shard: the card samples and evaluates from its shard,
  // in lockstep with its group (the rollout thread's over
  // job_.rollout_experts), and no card holds the whole model: each shard
  // writes its experts into a checkpoint (engine/train/checkpoint.h).
  bool samples_shard_ = false;
  // What the card samples from and publishes to its rollout thread:
  // gathered_ where it exists, else the policy (with LoRA its adapters;
  // with expert_sampling shard the card's shard).
  PolicyModel& RolloutSource() { return gathered_ ? *gathered_ : *ctx_.policy; }
  PolicyModel& SamplingPolicy();
  // Evaluation with plan.eval_before / eval_after: the lead's result; the
  // other cards of its expert group (expert_sampling shard) join its
  // forwards and get none.
  absl::StatusOr<std::optional<EvalResult>> Evaluate(const StepPlan& plan);
  // expert_sampling shard: runs `sample`, a rollout in lockstep over
  // `group` on this thread, and adds what it exchanged to the counters
  // below, which the next step record takes (the rollout thread's too).
  absl::Status CountSamplingExchanges(
      GradientSync* group, const std::function<absl::Status()>& sample);
  std::atomic<int64_t> sampling_alltoall_bytes_{0};
  std::atomic<int64_t> sampling_alltoall_us_{0};
  std::unique_ptr<FusedRollout> fused_;
  std::shared_ptr<CardMemoryManager> memory_;          // this card
  std::shared_ptr<CardMemoryManager> rollout_memory_;  // its rollout card's
  int per_card_threads_ = 1;
  // When this card's trainer and rollout compute: the step's time split,
  // and (fused) whether the trainer is in a training step, when the
  // rollout's decode steps take a share only.
  RoleOverlap overlap_;
  // Fused with a lag, every thread shared: concurrent or interleaved.
  std::unique_ptr<CardTurns> turns_;
  int64_t plan_step_ = 0;
  int plan_attempt_ = 0;
  // StaleSync across super nodes: the state after the last weight syncs
  // (at most two: the last committed one and a newer one), by step, and
  // the attempt of the last skewed plan.
  std::map<int64_t, StepSnapshot> sync_points_;
  int skewed_attempt_ = 0;
  // Resumed: the checkpoint's step and weights (RestorePrefetch).
  int64_t resumed_step_ = -1;
  uint32_t resumed_crc32c_ = 0;
  bool end_prefetch_saved_ = false;
};

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_CARD_RUNNER_IMPL_H_
