#include "rpc/remote_environment.h"

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "fusionrl/v1/environment.grpc.pb.h"
#include "fusionrl/v1/environment.pb.h"

namespace fusionrl::rpc {
namespace {

namespace pb = fusionrl::v1;

// Close is a courtesy (the server frees the episode's state): an episode
// ending must not wait long for it.
constexpr absl::Duration kCloseDeadline = absl::Seconds(1);

// Tool results can be long (a file listing, a test log); gRPC's default of
// 4 MiB would fail the episode on them.
constexpr int kMaxMessageBytes = 64 << 20;

// "host:port" or "[v6]:port" with a port in 1..65535; "" when valid, else
// why not.
std::string CheckHostPort(absl::string_view entry) {
  absl::string_view host;
  absl::string_view port;
  if (absl::StartsWith(entry, "[")) {
    size_t close = entry.find(']');
    if (close == absl::string_view::npos || close + 1 >= entry.size() ||
        entry[close + 1] != ':') {
      return "expected [ipv6]:port";
    }
    host = entry.substr(1, close - 1);
    port = entry.substr(close + 2);
  } else {
    size_t colon = entry.rfind(':');
    if (colon == absl::string_view::npos) return "expected host:port";
    host = entry.substr(0, colon);
    port = entry.substr(colon + 1);
    for (char c : host) {
      if (!absl::ascii_isalnum(c) && c != '.' && c != '-' && c != '_') {
        return absl::StrCat("character '", std::string(1, c),
                            "' in host (expected host:port)");
      }
    }
  }
  if (host.empty()) return "empty host (expected host:port)";
  int number = 0;
  if (port.empty() ||
      port.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(port, &number) || number < 1 || number > 65535) {
    return absl::StrCat("port '", port, "' is not in 1..65535");
  }
  return "";
}

// One environment server: its channel and stub, shared by the environment
// and its open episodes (an episode may outlive the environment). The
// stub holds no connection state of its own: the channel reconnects by
// itself after the server restarts, and every call is a fresh one.
struct Server {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::EnvironmentService::Stub> stub;
};

void SetDeadline(grpc::ClientContext& context, absl::Time deadline) {
  // No deadline only when the caller gave none (InfiniteFuture); a past
  // one fails the call at once with DEADLINE_EXCEEDED, as it should.
  if (deadline != absl::InfiniteFuture()) {
    context.set_deadline(absl::ToChronoTime(deadline));
  }
}

// "environment server <address>: <rpc>: <CODE>: <message>", with gRPC's
// code kept, except that a deadline passed while the channel was not
// connected (a server that does not accept connections: a host that drops
// them, a server still starting) is UNAVAILABLE, as a refused connection
// is: the rollout retries those (env.unavailable_seconds), not the others.
absl::Status CallError(const Server& server, absl::string_view rpc,
                       const grpc::Status& status) {
  auto code = static_cast<absl::StatusCode>(status.error_code());
  std::string message = status.error_message();
  if (code == absl::StatusCode::kDeadlineExceeded &&
      server.channel->GetState(/*try_to_connect=*/false) !=
          GRPC_CHANNEL_READY) {
    code = absl::StatusCode::kUnavailable;
    message = absl::StrCat("deadline exceeded while not connected (", message,
                           ")");
  }
  return absl::Status(
      code, absl::StrCat("environment server ", server.address, ": ", rpc, ": ",
                         absl::StatusCodeToString(code), ": ", message));
}

// An answer that breaks the protocol; Internal, since retrying the same
// call would not help.
absl::Status BadResponse(const Server& server, absl::string_view rpc,
                         absl::string_view why) {
  return absl::InternalError(absl::StrCat("environment server ", server.address,
                                          ": ", rpc,
                                          ": invalid response: ", why));
}

// Appends `messages` to `out`, refusing roles outside `allowed` (the chat
// template would render them wrongly or not at all).
std::string ConvertMessages(
    const google::protobuf::RepeatedPtrField<pb::EnvMessage>& messages,
    const std::set<std::string>& allowed, std::vector<ChatMessage>* out) {
  for (int i = 0; i < messages.size(); ++i) {
    const pb::EnvMessage& m = messages[i];
    if (allowed.count(m.role()) == 0) {
      return absl::StrCat("messages[", i, "].role is '", m.role(),
                          "', expected one of ", absl::StrJoin(allowed, ", "));
    }
    out->push_back(ChatMessage{m.role(), m.content()});
  }
  return "";
}

void FillTurn(const AssistantTurn& turn, pb::EnvAssistantTurn* t) {
  t->set_index(turn.index);
  t->set_text(turn.text);
  t->set_content(turn.content);
  for (const ToolCall& call : turn.tool_calls) {
    pb::EnvToolCall* c = t->add_tool_calls();
    c->set_name(call.name);
    c->set_arguments_json(call.arguments_json);
  }
  for (const std::string& error : turn.call_errors) {
    t->add_call_errors(error);
  }
  t->set_truncated(turn.truncated);
}

// The verdict fields of an EnvObservation or a CloseEpisodeResponse (the
// same names) into `out`; "" when valid, else why not.
template <class Message>
std::string ReadVerdict(const Message& m, Observation* out) {
  if (m.has_reward()) {
    // A NaN or infinite reward would poison the advantages of the group.
    if (!std::isfinite(m.reward())) {
      return absl::StrCat("reward ", m.reward(), " is not a finite number");
    }
    out->reward = m.reward();
  }
  if (m.has_correct()) out->correct = m.correct();
  for (const auto& [name, value] : m.metrics()) {
    if (name.empty() || !std::isfinite(value)) {
      return absl::StrCat("metric '", name, "' = ", value,
                          ": names must be non-empty and values finite");
    }
    out->metrics[name] = value;
  }
  return "";
}

class RemoteEpisode : public Episode {
 public:
  RemoteEpisode(std::shared_ptr<const Server> server, std::string episode_id)
      : server_(std::move(server)), episode_id_(std::move(episode_id)) {}

  ~RemoteEpisode() override {
    if (closed_) return;  // Truncate sent the Close
    // Best effort: a server that is down or slow has lost (or will drop)
    // the episode anyway, and an episode's end must not wait on it.
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCloseDeadline));
    pb::CloseEpisodeRequest request;
    request.set_episode_id(episode_id_);
    pb::CloseEpisodeResponse response;
    (void)server_->stub->Close(&context, request, &response);
  }

  absl::StatusOr<Observation> Step(const AssistantTurn& turn,
                                   absl::Time deadline) override {
    pb::StepEpisodeRequest request;
    request.set_episode_id(episode_id_);
    FillTurn(turn, request.mutable_turn());

    grpc::ClientContext context;
    SetDeadline(context, deadline);
    pb::StepEpisodeResponse response;
    grpc::Status status = server_->stub->Step(&context, request, &response);
    const std::string rpc =
        absl::StrCat("Step (episode ", episode_id_, ", turn ", turn.index, ")");
    if (!status.ok()) return CallError(*server_, rpc, status);

    const pb::EnvObservation& o = response.observation();
    Observation observation;
    // The interface's roles for answers; the number of tool messages need
    // not match the calls (a server may answer several calls in one).
    static const std::set<std::string>* const kStepRoles =
        new std::set<std::string>{"tool", "user"};
    if (std::string why =
            ConvertMessages(o.messages(), *kStepRoles, &observation.messages);
        !why.empty()) {
      return BadResponse(*server_, rpc, why);
    }
    observation.done = o.done();
    if (std::string why = ReadVerdict(o, &observation); !why.empty()) {
      return BadResponse(*server_, rpc, why);
    }
    return observation;
  }

  // Close(truncated) with the call's deadline; its answer is the verdict.
  absl::StatusOr<Observation> Truncate(const Cut& cut,
                                       absl::Time deadline) override {
    closed_ = true;
    pb::CloseEpisodeRequest request;
    request.set_episode_id(episode_id_);
    request.set_truncated(true);
    request.set_reason(cut.reason == CutReason::kMaxTurns
                           ? pb::ENV_CUT_MAX_TURNS
                           : pb::ENV_CUT_MAX_EPISODE_TOKENS);
    if (cut.turn.has_value()) FillTurn(*cut.turn, request.mutable_cut_turn());
    grpc::ClientContext context;
    SetDeadline(context, deadline);
    pb::CloseEpisodeResponse response;
    grpc::Status status = server_->stub->Close(&context, request, &response);
    const std::string rpc =
        absl::StrCat("Close (episode ", episode_id_, ", truncated)");
    if (!status.ok()) return CallError(*server_, rpc, status);
    Observation verdict;
    if (std::string why = ReadVerdict(response, &verdict); !why.empty()) {
      return BadResponse(*server_, rpc, why);
    }
    return verdict;
  }

 private:
  const std::shared_ptr<const Server> server_;
  const std::string episode_id_;
  bool closed_ = false;
};

class RemoteEnvironment : public Environment {
 public:
  explicit RemoteEnvironment(std::vector<std::shared_ptr<const Server>> servers)
      : servers_(std::move(servers)) {}

  absl::StatusOr<std::unique_ptr<Episode>> Open(const Problem& problem,
                                                uint64_t seed,
                                                absl::Time deadline,
                                                EpisodeStart* start) override {
    const std::shared_ptr<const Server>& server =
        servers_[seed % servers_.size()];
    pb::OpenEpisodeRequest request;
    pb::EnvProblem* p = request.mutable_problem();
    p->set_prompt(problem.prompt);
    p->set_answer(problem.answer);
    p->set_system(problem.system);
    for (const ChatMessage& m : problem.messages) {
      pb::EnvMessage* message = p->add_messages();
      message->set_role(m.role);
      message->set_content(m.content);
    }
    p->set_solution(problem.solution);
    request.set_seed(seed);

    grpc::ClientContext context;
    SetDeadline(context, deadline);
    pb::OpenEpisodeResponse response;
    grpc::Status status = server->stub->Open(&context, request, &response);
    if (!status.ok()) return CallError(*server, "Open", status);

    // From here on the server holds the episode: an invalid answer still
    // closes it (the episode's destructor).
    auto episode =
        std::make_unique<RemoteEpisode>(server, response.episode_id());
    if (response.episode_id().empty()) {
      return BadResponse(*server, "Open", "empty episode_id");
    }
    EpisodeStart opened;
    static const std::set<std::string>* const kOpenRoles =
        new std::set<std::string>{"system", "user", "assistant", "tool"};
    if (std::string why =
            ConvertMessages(response.messages(), *kOpenRoles, &opened.messages);
        !why.empty()) {
      return BadResponse(*server, "Open", why);
    }
    std::set<std::string> names;
    for (int i = 0; i < response.tools_size(); ++i) {
      const pb::EnvTool& tool = response.tools(i);
      if (tool.name().empty() || !names.insert(tool.name()).second) {
        return BadResponse(*server, "Open",
                           absl::StrCat("tools[", i, "].name '", tool.name(),
                                        "' is empty or offered twice"));
      }
      ToolSpec spec;
      spec.name = tool.name();
      spec.description = tool.description();
      // Passed on as text: the chat template renders it, and a schema that
      // is not valid JSON is the server's bug to see in the prompt, not a
      // reason to fail every episode.
      if (!tool.parameters_json().empty()) {
        spec.parameters_json = tool.parameters_json();
      }
      opened.tools.push_back(std::move(spec));
    }
    if (start != nullptr) *start = std::move(opened);
    return std::unique_ptr<Episode>(std::move(episode));
  }

 private:
  const std::vector<std::shared_ptr<const Server>> servers_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Environment>> MakeRemoteEnvironment(
    const EnvConfig& config) {
  if (absl::StripAsciiWhitespace(config.address).empty()) {
    return absl::InvalidArgumentError(
        "env.address: empty; env.name remote needs the environment servers "
        "as host:port[,host:port...]");
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // A restarted server is used again within about a second, not after
  // gRPC's default reconnect backoff of up to two minutes (during which
  // every Open to it would fail).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);

  std::vector<std::shared_ptr<const Server>> servers;
  for (absl::string_view raw : absl::StrSplit(config.address, ',')) {
    absl::string_view entry = absl::StripAsciiWhitespace(raw);
    if (std::string why = CheckHostPort(entry); !why.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "env.address: entry '", entry, "' of '", config.address, "': ", why));
    }
    auto server = std::make_shared<Server>();
    server->address = std::string(entry);
    server->channel = grpc::CreateCustomChannel(
        server->address, grpc::InsecureChannelCredentials(), args);
    server->stub = pb::EnvironmentService::NewStub(server->channel);
    servers.push_back(std::move(server));
  }
  return std::unique_ptr<Environment>(
      new RemoteEnvironment(std::move(servers)));
}

void RegisterRemoteEnvironment() {
  // A function-local static: initialized exactly once, thread-safe.
  static const bool registered = [] {
    absl::Status status = EnvironmentRegistry::Global().Register(
        "remote",
        [](const EnvConfig& config) { return MakeRemoteEnvironment(config); });
    // AlreadyExists: an embedding program registered its own "remote"
    // first; keep it.
    return status.ok();
  }();
  (void)registered;
}

}  // namespace fusionrl::rpc
