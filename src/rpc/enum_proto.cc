#include "rpc/enum_proto.h"

namespace fusionrl::rpc {

v1::JobPhase JobPhaseToProto(JobPhase phase) {
  switch (phase) {
    case JobPhase::kPending:
      return v1::JOB_PHASE_PENDING;
    case JobPhase::kWaitingForCapacity:
      return v1::JOB_PHASE_WAITING_FOR_CAPACITY;
    case JobPhase::kRunning:
      return v1::JOB_PHASE_RUNNING;
    case JobPhase::kSucceeded:
      return v1::JOB_PHASE_SUCCEEDED;
    case JobPhase::kFailed:
      return v1::JOB_PHASE_FAILED;
    case JobPhase::kCancelled:
      return v1::JOB_PHASE_CANCELLED;
  }
  return v1::JOB_PHASE_UNSPECIFIED;
}

JobPhase JobPhaseFromProto(v1::JobPhase phase) {
  switch (phase) {
    case v1::JOB_PHASE_WAITING_FOR_CAPACITY:
      return JobPhase::kWaitingForCapacity;
    case v1::JOB_PHASE_RUNNING:
      return JobPhase::kRunning;
    case v1::JOB_PHASE_SUCCEEDED:
      return JobPhase::kSucceeded;
    case v1::JOB_PHASE_FAILED:
      return JobPhase::kFailed;
    case v1::JOB_PHASE_CANCELLED:
      return JobPhase::kCancelled;
    default:
      return JobPhase::kPending;
  }
}

v1::CardRole CardRoleToProto(CardRole role) {
  switch (role) {
    case CardRole::kIdle:
      return v1::CARD_ROLE_IDLE;
    case CardRole::kColocated:
      return v1::CARD_ROLE_COLOCATED;
    case CardRole::kFused:
      return v1::CARD_ROLE_FUSED;
    case CardRole::kRollout:
      return v1::CARD_ROLE_ROLLOUT;
    case CardRole::kTrain:
      return v1::CARD_ROLE_TRAIN;
  }
  return v1::CARD_ROLE_UNSPECIFIED;
}

CardRole CardRoleFromProto(v1::CardRole role) {
  switch (role) {
    case v1::CARD_ROLE_COLOCATED:
      return CardRole::kColocated;
    case v1::CARD_ROLE_FUSED:
      return CardRole::kFused;
    case v1::CARD_ROLE_ROLLOUT:
      return CardRole::kRollout;
    case v1::CARD_ROLE_TRAIN:
      return CardRole::kTrain;
    default:
      return CardRole::kIdle;
  }
}

}  // namespace fusionrl::rpc
