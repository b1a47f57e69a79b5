// NodeService through a real gRPC server on 127.0.0.1 (port picked by the
// OS), with a fake clock driving liveness.
#include "rpc/node_service.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <memory>
#include <string>

#include "core/fake_clock.h"
#include "gtest/gtest.h"
#include "rpc/status_convert.h"

namespace fusionrl::rpc {
namespace {

using fusionrl::v1::DeregisterNodeRequest;
using fusionrl::v1::DeregisterNodeResponse;
using fusionrl::v1::HeartbeatRequest;
using fusionrl::v1::HeartbeatResponse;
using fusionrl::v1::NodeService;
using fusionrl::v1::RegisterNodeRequest;
using fusionrl::v1::RegisterNodeResponse;

class NodeServiceTest : public ::testing::Test {
 protected:
  NodeServiceTest()
      : registry_(clock_, absl::Seconds(10)),
        service_(registry_, absl::Seconds(3)) {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    EXPECT_GT(port, 0);
    stub_ = NodeService::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                            grpc::InsecureChannelCredentials()));
  }
  ~NodeServiceTest() override {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
  }

  // Every call carries a deadline.
  static void SetDeadline(grpc::ClientContext& context) {
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
  }

  grpc::Status Register(const RegisterNodeRequest& request,
                        RegisterNodeResponse* response) {
    grpc::ClientContext context;
    SetDeadline(context);
    return stub_->RegisterNode(&context, request, response);
  }

  grpc::Status Heartbeat(const std::string& node_id) {
    grpc::ClientContext context;
    SetDeadline(context);
    HeartbeatRequest request;
    request.set_node_id(node_id);
    HeartbeatResponse response;
    return stub_->Heartbeat(&context, request, &response);
  }

  static RegisterNodeRequest ValidRequest() {
    RegisterNodeRequest request;
    request.set_host("worker-a");
    request.set_super_node("sn-a");
    for (int i = 0; i < 2; ++i) {
      auto* card = request.add_cards();
      card->set_index(i);
      card->set_device("cpu");
    }
    return request;
  }

  FakeClock clock_;
  NodeRegistry registry_;
  NodeServiceImpl service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<NodeService::Stub> stub_;
};

TEST_F(NodeServiceTest, RegisterReturnsIdAndHeartbeatSchedule) {
  RegisterNodeResponse response;
  grpc::Status status = Register(ValidRequest(), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.node_id(), "node-1");
  EXPECT_EQ(response.heartbeat_interval_ms(), 3000);
  EXPECT_EQ(response.heartbeat_timeout_ms(), 10000);
  auto view = registry_.Get("node-1");
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->spec.cards.size(), 2u);
  EXPECT_EQ(view->spec.super_node, "sn-a");
}

TEST_F(NodeServiceTest, InvalidRegistrationIsInvalidArgumentNamingTheField) {
  RegisterNodeRequest request = ValidRequest();
  request.mutable_cards(1)->set_index(0);  // duplicate index
  RegisterNodeResponse response;
  grpc::Status status = Register(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("cards[1].index"), std::string::npos)
      << status.error_message();

  request = ValidRequest();
  request.clear_cards();
  EXPECT_EQ(Register(request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  request = ValidRequest();
  request.set_super_node("bad name!");
  EXPECT_EQ(Register(request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(NodeServiceTest, HeartbeatCodesForUnknownAliveAndLostNodes) {
  EXPECT_EQ(Heartbeat("node-42").error_code(), grpc::StatusCode::NOT_FOUND);
  RegisterNodeResponse response;
  ASSERT_TRUE(Register(ValidRequest(), &response).ok());
  const std::string id = response.node_id();
  clock_.Advance(absl::Seconds(9));
  EXPECT_TRUE(Heartbeat(id).ok());
  clock_.Advance(absl::Seconds(9));
  EXPECT_TRUE(registry_.SweepLost().empty());  // heard from 9 s ago
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(registry_.SweepLost(), std::vector<std::string>{id});
  grpc::Status late = Heartbeat(id);
  EXPECT_EQ(late.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(late.error_message().find("register again"), std::string::npos);
}

TEST_F(NodeServiceTest, DeregisterForgetsTheNode) {
  RegisterNodeResponse response;
  ASSERT_TRUE(Register(ValidRequest(), &response).ok());
  grpc::ClientContext context;
  SetDeadline(context);
  DeregisterNodeRequest request;
  request.set_node_id(response.node_id());
  DeregisterNodeResponse reply;
  ASSERT_TRUE(stub_->DeregisterNode(&context, request, &reply).ok());
  EXPECT_FALSE(registry_.Get(response.node_id()).has_value());
  EXPECT_EQ(Heartbeat(response.node_id()).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

// An error quoting a caller's huge input still reaches the caller: the
// message is cut (it travels in a header clients cap at 8 KiB), the code
// kept; short messages cross unchanged.
TEST(StatusConvertTest, LongMessagesAreCutShortOnesKept) {
  const grpc::Status cut = ToGrpcStatus(
      absl::InvalidArgumentError("node-1: " + std::string(1 << 20, 'x')));
  EXPECT_EQ(cut.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LE(cut.error_message().size(), kMaxStatusMessageBytes + 40);
  EXPECT_EQ(cut.error_message().substr(0, 8), "node-1: ");
  EXPECT_NE(cut.error_message().find("(1046536 more bytes)"), std::string::npos)
      << cut.error_message().substr(kMaxStatusMessageBytes);
  const grpc::Status kept = ToGrpcStatus(absl::NotFoundError("no job 'job-9'"));
  EXPECT_EQ(kept.error_message(), "no job 'job-9'");
  EXPECT_EQ(FromGrpcStatus(kept).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace fusionrl::rpc
