// CardRole: what a card does for a job. One enum for the three places that
// speak of it: the scheduler's placement (which never assigns kIdle), the
// worker's heartbeats, and the controller's status view.
#ifndef FUSIONRL_CORE_CARD_ROLE_H_
#define FUSIONRL_CORE_CARD_ROLE_H_

#include "absl/strings/string_view.h"

namespace fusionrl {

//   kIdle:      registered, no work (a heartbeat's card outside any job).
//   kColocated: trains and samples, alternating (placement.mode
//               colocated-sync).
//   kFused:     trains and samples at the same time (RL Fusion; mode fused).
//   kRollout / kTrain: one or the other (mode disaggregated).
enum class CardRole { kIdle, kColocated, kFused, kRollout, kTrain };

// "idle", "colocated", "fused", "rollout", "train".
constexpr absl::string_view CardRoleName(CardRole role) {
  switch (role) {
    case CardRole::kIdle:
      return "idle";
    case CardRole::kColocated:
      return "colocated";
    case CardRole::kFused:
      return "fused";
    case CardRole::kRollout:
      return "rollout";
    case CardRole::kTrain:
      return "train";
  }
  return "unknown";
}

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_CARD_ROLE_H_
