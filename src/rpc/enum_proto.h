// The enums both sides of the wire name: a job's phase and a card's role,
// plain (fusionrl/job.h, core/card_role.h) <-> v1. One place for the
// controller's edge, the worker's heartbeats and the local Job handle.
#ifndef FUSIONRL_RPC_ENUM_PROTO_H_
#define FUSIONRL_RPC_ENUM_PROTO_H_

#include "core/card_role.h"
#include "fusionrl/job.h"
#include "fusionrl/v1/common.pb.h"
#include "fusionrl/v1/job.pb.h"

namespace fusionrl::rpc {

v1::JobPhase JobPhaseToProto(JobPhase phase);
// UNSPECIFIED (a journal record of a job that had not ended; a message
// from a client that left it unset) reads as kPending.
JobPhase JobPhaseFromProto(v1::JobPhase phase);
v1::CardRole CardRoleToProto(CardRole role);
// UNSPECIFIED reads as kIdle.
CardRole CardRoleFromProto(v1::CardRole role);

}  // namespace fusionrl::rpc

#endif  // FUSIONRL_RPC_ENUM_PROTO_H_
