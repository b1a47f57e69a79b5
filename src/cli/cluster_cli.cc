#include "cli/cluster_cli.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cli/cluster_status_text.h"
#include "cli/common/exit_codes.h"
#include "controller/controller.h"
#include "core/clock.h"
#include "core/config_override.h"
#include "core/memory_manager.h"
#include "core/metrics.h"
#include "fusionrl/config.h"
#include "fusionrl/v1/job.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "rpc/auth.h"
#include "rpc/status_convert.h"
#include "spdlog/spdlog.h"
#include "worker/worker.h"

namespace fusionrl::cli {
namespace {

absl::StatusOr<std::shared_ptr<grpc::Channel>> Connect(
    const ClusterArgs& args) {
  if (args.controller.empty()) {
    return absl::InvalidArgumentError("--controller HOST:PORT is required");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::InsecureChannelCredentials();
  if (!args.tls_ca.empty()) {
    auto ca = ReadTextFile(args.tls_ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *ca;
    credentials = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(1 << 30);
  channel_args.SetMaxSendMessageSize(1 << 30);
  // A restarted controller is found within seconds, not gRPC's default
  // reconnect backoff of up to two minutes.
  channel_args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  channel_args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  return grpc::CreateCustomChannel(args.controller, credentials, channel_args);
}

absl::StatusOr<std::string> Token(const ClusterArgs& args,
                                  const JobConfig* config) {
  if (!args.token_file.empty() || !args.token_env.empty()) {
    return rpc::LoadToken(args.token_file, args.token_env);
  }
  if (config != nullptr) {
    return rpc::LoadToken(config->cluster.auth_token_file,
                          config->cluster.auth_token_env);
  }
  return std::string();
}

void Prepare(grpc::ClientContext& ctx, const std::string& token,
             absl::Duration timeout) {
  ctx.set_deadline(absl::ToChronoTime(RealClock().Now() + timeout));
  rpc::AttachToken(ctx, token);
}

absl::Status FromGrpc(const grpc::Status& st, const std::string& what) {
  absl::Status s = rpc::FromGrpcStatus(st);
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

int RunController(const ClusterArgs& args, const std::atomic<bool>& stop) {
  ControllerOptions options;
  options.listen_address = args.listen;
  options.heartbeat_interval = absl::Seconds(args.heartbeat_interval_s);
  options.heartbeat_timeout = absl::Seconds(args.heartbeat_timeout_s);
  options.tls_cert_file = args.tls_cert;
  options.tls_key_file = args.tls_key;
  options.state_dir = args.state_dir;
  options.stall_timeout = absl::Seconds(args.stall_timeout_s);
  options.stall_fails = args.on_stall == "fail";
  options.http_address = args.http;
  auto token = Token(args, nullptr);
  if (!token.ok()) return Fail(token.status());
  options.auth_token = *token;
  auto controller = Controller::Start(options);
  if (!controller.ok()) return Fail(controller.status());
  const std::string host = args.listen.substr(0, args.listen.rfind(':'));
  // The one line scripts read: where to connect.
  std::cout << "listening on " << host << ":" << (*controller)->port()
            << std::endl;
  spdlog::info("controller: listening on {}:{}{}{}", host,
               (*controller)->port(), token->empty() ? "" : ", token required",
               args.tls_cert.empty() ? "" : ", TLS");
  if (!args.http.empty()) {
    // The second line scripts read: where the dashboard is.
    std::cout << "http on " << args.http.substr(0, args.http.rfind(':')) << ":"
              << (*controller)->http_port() << std::endl;
  }
  while (!stop.load()) SleepOnClock(RealClock(), absl::Milliseconds(100));
  spdlog::info(
      "controller: stopping: running jobs end after their current step "
      "with a checkpoint");
  (*controller)->Drain(absl::Seconds(args.drain_timeout_s));
  (*controller)->Shutdown();
  return kExitOk;
}

int RunWorker(const ClusterArgs& args, const std::atomic<bool>& stop) {
  auto channel = Connect(args);
  if (!channel.ok()) return Fail(channel.status());
  auto token = Token(args, nullptr);
  if (!token.ok()) return Fail(token.status());
  WorkerOptions options;
  options.cards = args.cards;
  options.super_node =
      args.super_node.empty() ? std::string("sn-0") : args.super_node;
  options.device = args.device;
  options.threads = args.threads;
  options.debug_step_delay = absl::Milliseconds(args.debug_step_delay_ms);
  options.debug_checkpoint_delay =
      absl::Milliseconds(args.debug_checkpoint_delay_ms);
  options.reconnect_timeout = absl::Seconds(args.reconnect_timeout_s);
  options.auth_token = *token;
  Worker worker(*channel, options);
  absl::Status s = worker.Run(&stop);
  if (!s.ok()) return Fail(s);
  return kExitOk;
}

int WatchUntilDone(v1::JobService::Stub& stub, const std::string& token,
                   const std::string& job_id, bool json) {
  grpc::ClientContext ctx;
  rpc::AttachToken(ctx, token);
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  auto reader = stub.WatchJob(&ctx, request);
  v1::JobStatus status;
  int64_t last_step = -1;
  while (reader->Read(&status)) {
    if (json) {
      std::cout << ToJson(status) << std::endl;
    } else if (status.step() != last_step || Terminal(status.phase())) {
      last_step = status.step();
      std::cerr << FormatStatus(status);
    }
  }
  grpc::Status st = reader->Finish();
  if (!st.ok()) return Fail(FromGrpc(st, "WatchJob"));
  if (status.phase() == v1::JOB_PHASE_SUCCEEDED) return kExitOk;
  if (status.phase() == v1::JOB_PHASE_CANCELLED) return kExitCancelled;
  std::fprintf(stderr, "fusionrl: %s failed: %s\n", job_id.c_str(),
               status.message().c_str());
  return kExitFailure;
}

int RunSubmit(const ClusterArgs& args) {
  auto text = ReadTextFile(args.config_path, "job file");
  if (!text.ok()) return Fail(text.status());
  std::vector<std::string> overrides = args.overrides;
  if (!args.output_dir.empty()) {
    overrides.push_back(QuotedOverride("output_dir", args.output_dir));
  }
  // Check locally first: the same errors, without a round trip.
  auto config = ParseJobConfig(*text, args.config_path, overrides);
  if (!config.ok()) return Fail(config.status());
  auto token = Token(args, &*config);
  if (!token.ok()) return Fail(token.status());
  auto channel = Connect(args);
  if (!channel.ok()) return Fail(channel.status());
  auto stub = v1::JobService::NewStub(*channel);
  v1::SubmitJobRequest request;
  request.set_config_yaml(*text);
  request.set_source_name(args.config_path);
  for (const std::string& o : overrides) request.add_overrides(o);
  request.set_resume(args.resume);
  v1::SubmitJobResponse response;
  grpc::ClientContext ctx;
  Prepare(ctx, *token, absl::Seconds(30));
  grpc::Status st = stub->SubmitJob(&ctx, request, &response);
  if (!st.ok()) return Fail(FromGrpc(st, "SubmitJob"));
  std::cout << response.job_id() << std::endl;
  if (!args.wait) return kExitOk;
  return WatchUntilDone(*stub, *token, response.job_id(), /*json=*/false);
}

int RunStatus(const ClusterArgs& args, const std::atomic<bool>& stop) {
  auto token = Token(args, nullptr);
  if (!token.ok()) return Fail(token.status());
  auto channel = Connect(args);
  if (!channel.ok()) return Fail(channel.status());
  auto stub = v1::JobService::NewStub(*channel);
  const bool tty = isatty(STDOUT_FILENO) != 0;
  for (bool first = true;; first = false) {
    std::string text;
    bool ended = false;
    if (!args.job_id.empty()) {
      v1::GetJobStatusRequest request;
      request.set_job_id(args.job_id);
      v1::JobStatus status;
      grpc::ClientContext ctx;
      Prepare(ctx, *token, absl::Seconds(30));
      grpc::Status st = stub->GetJobStatus(&ctx, request, &status);
      if (!st.ok()) return Fail(FromGrpc(st, "GetJobStatus"));
      text = args.json ? ToJson(status) + "\n" : FormatStatus(status);
      ended = Terminal(status.phase());
    } else {
      v1::ClusterStatus status;
      grpc::ClientContext ctx;
      Prepare(ctx, *token, absl::Seconds(30));
      grpc::Status st =
          stub->GetClusterStatus(&ctx, v1::GetClusterStatusRequest(), &status);
      if (!st.ok()) return Fail(FromGrpc(st, "GetClusterStatus"));
      text = args.json ? ToJson(status) + "\n" : FormatCluster(status);
    }
    if (!args.watch) {
      std::cout << text << std::flush;
      return kExitOk;
    }
    if (args.json) {
      std::cout << text << std::flush;  // one JSON document per refresh
    } else if (tty) {
      // Refresh in place: home, clear the screen, draw.
      std::cout << "\x1b[H\x1b[2J"
                << absl::FormatTime("%H:%M:%S", RealClock().Now(),
                                    absl::LocalTimeZone())
                << "  (every " << args.watch_interval_s
                << " s; Ctrl-C to stop)\n"
                << text << std::flush;
    } else {
      std::cout << (first ? "" : "\n") << text << std::flush;
    }
    if (ended) return kExitOk;
    const absl::Time next =
        RealClock().Now() + absl::Seconds(args.watch_interval_s);
    while (RealClock().Now() < next) {
      if (stop.load()) return kExitOk;
      SleepOnClock(RealClock(), absl::Milliseconds(50));
    }
  }
}

void AddAuthFlags(CLI::App* cmd, ClusterArgs& args) {
  cmd->add_option("--token-file", args.token_file,
                  "file whose first line is the shared auth token");
  cmd->add_option("--token-env", args.token_env,
                  "environment variable holding the shared auth token");
}

void AddClientFlags(CLI::App* cmd, ClusterArgs& args) {
  cmd->add_option("--controller", args.controller,
                  "controller address HOST:PORT")
      ->required();
  cmd->add_option("--tls-ca", args.tls_ca,
                  "PEM file of the CA that signed the controller's "
                  "certificate (connect with TLS)");
  AddAuthFlags(cmd, args);
}

}  // namespace

ClusterCommands AddClusterCommands(CLI::App& app, ClusterArgs& args) {
  ClusterCommands c;
  c.controller = app.add_subcommand(
      "controller", "serve jobs to workers (prints 'listening on HOST:PORT')");
  c.controller->add_option("--listen", args.listen, "HOST:PORT (port 0 = any)")
      ->required();
  c.controller->add_option("--heartbeat-interval", args.heartbeat_interval_s,
                           "seconds between worker heartbeats (default 1)");
  c.controller->add_option("--heartbeat-timeout", args.heartbeat_timeout_s,
                           "seconds of silence before a worker is lost "
                           "(default 10)");
  c.controller->add_option(
      "--state-dir", args.state_dir,
      "keep nodes, jobs and their committed steps in DIR and continue them "
      "when started again with it (docs/cluster.md#controller-restart)");
  c.controller
      ->add_option("--stall-timeout", args.stall_timeout_s,
                   "seconds without a committed step before the watchdog "
                   "names what each card of the job is doing and acts "
                   "(--on-stall); 0 = off (default 1800)")
      ->check(CLI::NonNegativeNumber);
  c.controller
      ->add_option("--on-stall", args.on_stall,
                   "what the watchdog does: replan the step (default) or "
                   "fail the job")
      ->check(CLI::IsMember({"replan", "fail"}));
  c.controller->add_option("--drain-timeout", args.drain_timeout_s,
                           "on SIGINT/SIGTERM, seconds to wait for running "
                           "jobs to checkpoint (default 600)");
  c.controller->add_option(
      "--http", args.http,
      "HOST:PORT of the dashboard (/), /api/status and Prometheus /metrics "
      "(port 0 = any; prints 'http on HOST:PORT'); the auth token protects "
      "it too (docs/observability.md)");
  c.controller->add_option("--tls-cert", args.tls_cert,
                           "PEM certificate chain: serve TLS");
  c.controller->add_option("--tls-key", args.tls_key, "PEM private key");
  AddAuthFlags(c.controller, args);

  c.worker = app.add_subcommand("worker", "offer this machine's cards");
  AddClientFlags(c.worker, args);
  c.worker->add_option("--reconnect-timeout", args.reconnect_timeout_s,
                       "seconds to keep retrying when the controller is "
                       "gone, so one restarted with --state-dir continues "
                       "the job (default 60)");
  c.worker->add_option("--cards", args.cards, "cards to offer (default 1)")
      ->check(CLI::Range(1, 1024));
  c.worker->add_option("--super-node", args.super_node,
                       "super node name (default sn-0)");
  c.worker->add_option("--device", args.device, "card device: cpu | cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  c.worker
      ->add_option("--threads", args.threads,
                   "LibTorch intra-op threads for this worker's cards "
                   "(default: the job's num_threads; lower it when "
                   "several workers share a machine)")
      ->check(CLI::Range(1, 4096));
  c.worker
      ->add_option("--debug-step-delay-ms", args.debug_step_delay_ms,
                   "fault injection for tests: sleep after every step (a "
                   "slow super node)")
      ->check(CLI::Range(0, 600000));
  c.worker
      ->add_option("--debug-checkpoint-delay-ms",
                   args.debug_checkpoint_delay_ms,
                   "fault injection for tests: pause inside every checkpoint "
                   "write, before it is moved into place")
      ->check(CLI::Range(0, 600000));

  c.submit = app.add_subcommand("submit", "submit a job; prints its id");
  c.submit->add_option("config", args.config_path, "job YAML file")->required();
  AddClientFlags(c.submit, args);
  c.submit
      ->add_option("--set", args.overrides,
                   "override a config key: key.path=value (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  c.submit->add_option("--output-dir,-o", args.output_dir,
                       "overrides output_dir (a path the workers can reach)");
  c.submit->add_flag("--resume", args.resume,
                     "continue from the newest checkpoint in output_dir");
  c.submit->add_flag("--wait", args.wait,
                     "follow the job to its end (exit 0 succeeded, 1 failed, "
                     "130 cancelled)");

  c.status = app.add_subcommand(
      "status", "show the cluster (nodes, cards, what they do) and its jobs");
  AddClientFlags(c.status, args);
  c.status->add_option("--job", args.job_id,
                       "one job (default: the whole cluster)");
  c.status->add_flag("--json", args.json, "JSON instead of a table");
  c.status->add_flag("--watch", args.watch,
                     "refresh in place until Ctrl-C (with --job: until the "
                     "job ends)");
  c.status
      ->add_option("--interval", args.watch_interval_s,
                   "seconds between --watch refreshes (default 2)")
      ->check(CLI::Range(0.1, 3600.0));
  return c;
}

int RunClusterCommand(const ClusterCommands& commands, const ClusterArgs& args,
                      const std::atomic<bool>& stop) {
  if (commands.controller->parsed()) return RunController(args, stop);
  if (commands.worker->parsed()) return RunWorker(args, stop);
  if (commands.submit->parsed()) return RunSubmit(args);
  return RunStatus(args, stop);
}

}  // namespace fusionrl::cli
