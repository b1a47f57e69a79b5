// JobService and WorkService over gRPC: adapters between the protocol and
// the controller's JobManager. Synchronous services: a waiting call (a long
// poll, a collective round, the end-of-step barrier) holds one server thread
// until its deadline, which the JobManager bounds.
//
// Every handler checks the shared token first (UNAUTHENTICATED), then the
// request (INVALID_ARGUMENT naming the field), then the ids (NOT_FOUND,
// FAILED_PRECONDITION, PERMISSION_DENIED for a node outside the job).
//
// Ownership: borrow the manager, which must outlive the services and the
// server they are registered with.
#ifndef FUSIONRL_CONTROLLER_SERVICES_H_
#define FUSIONRL_CONTROLLER_SERVICES_H_

#include <functional>
#include <string>

#include "controller/job_manager.h"
#include "fusionrl/v1/job.grpc.pb.h"
#include "fusionrl/v1/work.grpc.pb.h"

namespace fusionrl {

class JobServiceImpl final : public v1::JobService::Service {
 public:
  // `cluster` makes GetClusterStatus's answer (the Controller's
  // ClusterStatus(): the manager's view plus version and uptime).
  JobServiceImpl(JobManager& jobs, std::string auth_token,
                 std::function<v1::ClusterStatus()> cluster);

  grpc::Status SubmitJob(grpc::ServerContext* context,
                         const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override;
  grpc::Status GetJobStatus(grpc::ServerContext* context,
                            const v1::GetJobStatusRequest* request,
                            v1::JobStatus* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context,
                        const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobStatus>* writer) override;
  grpc::Status CancelJob(grpc::ServerContext* context,
                         const v1::CancelJobRequest* request,
                         v1::JobStatus* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context,
                        const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status GetClusterStatus(grpc::ServerContext* context,
                                const v1::GetClusterStatusRequest* request,
                                v1::ClusterStatus* response) override;
  grpc::Status GetJobHistory(grpc::ServerContext* context,
                             const v1::GetJobHistoryRequest* request,
                             v1::JobHistory* response) override;

 private:
  JobManager& jobs_;
  std::string auth_token_;
  std::function<v1::ClusterStatus()> cluster_;
};

class WorkServiceImpl final : public v1::WorkService::Service {
 public:
  WorkServiceImpl(JobManager& jobs, std::string auth_token);

  grpc::Status GetAssignment(grpc::ServerContext* context,
                             const v1::GetAssignmentRequest* request,
                             v1::GetAssignmentResponse* response) override;
  grpc::Status GetStepPlan(grpc::ServerContext* context,
                           const v1::GetStepPlanRequest* request,
                           v1::StepPlan* response) override;
  grpc::Status Reduce(grpc::ServerContext* context,
                      const v1::ReduceRequest* request,
                      v1::ReduceResponse* response) override;
  grpc::Status ExchangeUpdates(grpc::ServerContext* context,
                               const v1::ExchangeUpdatesRequest* request,
                               v1::ExchangeUpdatesResponse* response) override;
  grpc::Status Store(grpc::ServerContext* context,
                     const v1::StoreRequest* request,
                     v1::StoreResponse* response) override;
  grpc::Status FinishStep(grpc::ServerContext* context,
                          const v1::FinishStepRequest* request,
                          v1::FinishStepResponse* response) override;

 private:
  JobManager& jobs_;
  std::string auth_token_;
};

}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_SERVICES_H_
