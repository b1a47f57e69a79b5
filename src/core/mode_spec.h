// Mode specs: the short names `fusionrl bench --modes` and `fusionrl
// simulate --modes` give a placement mode and its StaleSync knobs
// ("fused+stalesync:2", "disaggregated:1+partial:64"), parsed once into a
// typed change of a JobConfig.
//
// Two grammars share the one parser; each accepts only its own spellings:
//   kBench:    colocated-sync | fused | fused+stalesync[:s] |
//              disaggregated[:s], each optionally followed, in this order,
//              by +turns:T (placement.fused_turns), +partial:N
//              (stalesync.partial_rollout_tokens), +version:V
//              (stalesync.rollout_version) and +shared:M
//              (stalesync.steps_per_version). s defaults to 2 for
//              fused+stalesync and 0 for disaggregated.
//   kSimulate: colocated-sync | fused | fused+stalesync[:s[:k]], s the policy
//              lag and k the clock skew (both 2 when omitted, k = s when
//              only s is given).
// s and k lie in 0..1024. A bad spec is an InvalidArgument "--modes: ..."
// that quotes it.
#ifndef FUSIONRL_CORE_MODE_SPEC_H_
#define FUSIONRL_CORE_MODE_SPEC_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "fusionrl/config.h"

namespace fusionrl {

enum class ModeGrammar { kBench, kSimulate };

// What a mode spec sets. A knob left unset keeps the config's value; which
// knobs a spec sets is its grammar's: kBench sets the placement, the policy
// lag, fused_turns, partial_rollout_tokens and steps_per_version (their
// defaults when the spec has no suffix for them) and rollout_version only
// with +version; kSimulate sets the placement, the policy lag and the clock
// skew (0 outside fused+stalesync).
struct ModeSpec {
  std::string name;  // the spec as given
  PlacementMode placement = PlacementMode::kColocatedSync;
  int policy_lag = 0;             // stalesync.max_policy_lag
  std::optional<int> clock_skew;  // stalesync.max_clock_skew
  std::optional<FusedTurns> fused_turns;
  std::optional<int> partial_rollout_tokens;
  std::optional<RolloutVersion> rollout_version;
  std::optional<int> steps_per_version;
};

absl::StatusOr<ModeSpec> ParseModeSpec(const std::string& text,
                                       ModeGrammar grammar);

// Sets the spec's knobs on `config`: placement.mode (disaggregated also
// puts one rollout card beside each training card: rollout cards = the
// config's cards, cards doubled), stalesync.max_policy_lag (a lag above 0
// turns on algorithm.decoupled_loss), and every knob the spec sets. Does
// not validate: the config's consumer does, as for any config built in
// code.
void ApplyModeSpec(const ModeSpec& mode, JobConfig& config);

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_MODE_SPEC_H_
