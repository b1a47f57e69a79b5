// The readable text of `fusionrl status` and `submit --wait`: a job's
// status, the cluster's nodes, cards and jobs, and the JSON of either
// (docs/cluster.md).
#ifndef FUSIONRL_CLI_CLUSTER_STATUS_TEXT_H_
#define FUSIONRL_CLI_CLUSTER_STATUS_TEXT_H_

#include <string>

#include "fusionrl/v1/job.grpc.pb.h"

namespace fusionrl::cli {

// True for a phase a job does not leave (succeeded, failed, cancelled).
bool Terminal(v1::JobPhase phase);

// The phase without its JOB_PHASE_ prefix ("RUNNING").
std::string PhaseName(v1::JobPhase phase);

// The role without its CARD_ROLE_ prefix, lower case ("trainer").
std::string RoleName(v1::CardRole role);

// `message` as JSON with every field and the proto's field names; "{}" when
// it cannot be printed.
std::string ToJson(const google::protobuf::Message& message);

// One job: phase and progress, the last step's figures, its nodes and cards,
// and its recent events. Ends with a newline.
std::string FormatStatus(const v1::JobStatus& s);

// The cluster, with or without jobs: super nodes, nodes, cards and what
// each card is doing, then the jobs. Ends with a newline.
std::string FormatCluster(const v1::ClusterStatus& c);

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_CLUSTER_STATUS_TEXT_H_
