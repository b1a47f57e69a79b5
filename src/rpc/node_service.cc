#include "rpc/node_service.h"

#include <string>
#include <utility>

#include "rpc/auth.h"
#include "rpc/status_convert.h"

namespace fusionrl::rpc {
namespace {

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                 const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

NodeSpec ToNodeSpec(const fusionrl::v1::RegisterNodeRequest& request) {
  NodeSpec spec;
  spec.host = request.host();
  spec.super_node = request.super_node();
  spec.host_memory_bytes = request.host_memory_bytes();
  spec.version = request.version();
  for (const auto& card : request.cards()) {
    spec.cards.push_back(
        CardSpec{card.index(), card.device(), card.memory_bytes()});
  }
  return spec;
}

}  // namespace

NodeServiceImpl::NodeServiceImpl(NodeRegistry& registry,
                                 absl::Duration heartbeat_interval)
    : registry_(registry), heartbeat_interval_(heartbeat_interval) {}

grpc::ServerUnaryReactor* NodeServiceImpl::RegisterNode(
    grpc::CallbackServerContext* context,
    const fusionrl::v1::RegisterNodeRequest* request,
    fusionrl::v1::RegisterNodeResponse* response) {
  if (grpc::Status auth = CheckAuth(*context, hooks_.auth_token); !auth.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(auth);
    return reactor;
  }
  absl::StatusOr<std::string> id = registry_.Register(ToNodeSpec(*request));
  if (!id.ok()) return Finish(context, id.status());
  response->set_node_id(*id);
  response->set_heartbeat_interval_ms(
      static_cast<int32_t>(absl::ToInt64Milliseconds(heartbeat_interval_)));
  response->set_heartbeat_timeout_ms(static_cast<int32_t>(
      absl::ToInt64Milliseconds(registry_.heartbeat_timeout())));
  if (hooks_.on_register) hooks_.on_register(*id);
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* NodeServiceImpl::Heartbeat(
    grpc::CallbackServerContext* context,
    const fusionrl::v1::HeartbeatRequest* request,
    fusionrl::v1::HeartbeatResponse* response) {
  if (grpc::Status auth = CheckAuth(*context, hooks_.auth_token); !auth.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(auth);
    return reactor;
  }
  response->set_shutdown(false);
  absl::Status status = registry_.Heartbeat(request->node_id());
  if (status.ok() && hooks_.on_heartbeat) {
    response->set_shutdown(hooks_.on_heartbeat(*request));
  }
  return Finish(context, status);
}

grpc::ServerUnaryReactor* NodeServiceImpl::DeregisterNode(
    grpc::CallbackServerContext* context,
    const fusionrl::v1::DeregisterNodeRequest* request,
    fusionrl::v1::DeregisterNodeResponse* response) {
  if (grpc::Status auth = CheckAuth(*context, hooks_.auth_token); !auth.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(auth);
    return reactor;
  }
  absl::Status status = registry_.Deregister(request->node_id());
  if (status.ok() && hooks_.on_deregister) {
    hooks_.on_deregister(request->node_id());
  }
  return Finish(context, status);
}

}  // namespace fusionrl::rpc
