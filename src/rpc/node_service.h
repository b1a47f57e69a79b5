// NodeService over gRPC: the adapter between fusionrl.v1.NodeService and the
// controller's NodeRegistry.
//
// Each handler converts the request to core types, calls the registry and
// maps its absl::Status to the same gRPC code (INVALID_ARGUMENT names the bad
// field, NOT_FOUND an unknown node, FAILED_PRECONDITION a node declared
// lost). Handlers run on gRPC's callback threads and finish inline; the
// registry is internally locked.
//
// Ownership: borrows the registry, which must outlive the service and the
// server it is registered with.
#ifndef FUSIONRL_RPC_NODE_SERVICE_H_
#define FUSIONRL_RPC_NODE_SERVICE_H_

#include <functional>
#include <string>

#include "absl/time/time.h"
#include "core/node_registry.h"
#include "fusionrl/v1/node.grpc.pb.h"

namespace fusionrl::rpc {

class NodeServiceImpl final
    : public fusionrl::v1::NodeService::CallbackService {
 public:
  // `heartbeat_interval` is what workers are told to use; it should be well
  // under the registry's timeout (a third of it is a good choice).
  NodeServiceImpl(NodeRegistry& registry, absl::Duration heartbeat_interval);

  // What the controller adds around the registry. Set before the server
  // starts.
  struct Hooks {
    std::string auth_token;  // "" = no authentication (rpc/auth.h)
    // After a node registered (e.g. to place waiting jobs).
    std::function<void(const std::string& node_id)> on_register;
    // After an accepted heartbeat; returns true to order the node to shut
    // down.
    std::function<bool(const fusionrl::v1::HeartbeatRequest&)> on_heartbeat;
    // After a node deregistered.
    std::function<void(const std::string& node_id)> on_deregister;
  };
  void set_hooks(Hooks hooks) { hooks_ = std::move(hooks); }

  grpc::ServerUnaryReactor* RegisterNode(
      grpc::CallbackServerContext* context,
      const fusionrl::v1::RegisterNodeRequest* request,
      fusionrl::v1::RegisterNodeResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(
      grpc::CallbackServerContext* context,
      const fusionrl::v1::HeartbeatRequest* request,
      fusionrl::v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* DeregisterNode(
      grpc::CallbackServerContext* context,
      const fusionrl::v1::DeregisterNodeRequest* request,
      fusionrl::v1::DeregisterNodeResponse* response) override;

 private:
  NodeRegistry& registry_;
  absl::Duration heartbeat_interval_;
  Hooks hooks_;
};

}  // namespace fusionrl::rpc

#endif  // FUSIONRL_RPC_NODE_SERVICE_H_
