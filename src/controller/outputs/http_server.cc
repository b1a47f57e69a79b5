#include "controller/outputs/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <map>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "controller/outputs/status_export.h"
#include "rpc/auth.h"
#include "spdlog/spdlog.h"

namespace fusionrl {

struct HttpServer::Impl {
  httplib::Server server;
  std::thread thread;
  int port = 0;
  std::string token;
  HttpSources sources;
  // Curves folded incrementally: each request parses only new records.
  absl::Mutex curves_mu;
  std::map<std::string, JobCurves> curves ABSL_GUARDED_BY(curves_mu);

  bool Authorized(const httplib::Request& req) const {
    if (token.empty()) return true;
    const std::string header = req.get_header_value("Authorization");
    if (absl::StartsWith(header, "Bearer ") &&
        rpc::ConstantTimeEquals(absl::string_view(header).substr(7), token)) {
      return true;
    }
    return req.has_param("token") &&
           rpc::ConstantTimeEquals(req.get_param_value("token"), token);
  }

  std::string StatusJsonNow() {
    v1::ClusterStatus status = sources.cluster();
    absl::MutexLock lock(&curves_mu);
    std::map<std::string, JobCurves> kept;
    for (const v1::JobStatus& job : status.jobs()) {
      JobCurves& c = curves[job.job_id()];
      absl::StatusOr<v1::JobHistory> h =
          sources.history(job.job_id(), c.last_seq);
      if (h.ok()) c.Add(*h);
      kept[job.job_id()] = std::move(c);
    }
    curves = std::move(kept);  // forget jobs the controller forgot
    return StatusJson(status, curves, sources.grpc_address);
  }
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::port() const { return impl_->port; }

void HttpServer::Stop() {
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& address, const std::string& auth_token,
    HttpSources sources) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http: '", address, "' is not HOST:PORT (e.g. 0.0.0.0:8080)"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // [::1]:8080
  }
  auto impl = std::make_unique<Impl>();
  impl->token = auth_token;
  impl->sources = std::move(sources);
  Impl* self = impl.get();
  httplib::Server& s = impl->server;
  s.new_task_queue = [] { return new httplib::ThreadPool(4); };
  s.set_read_timeout(10);
  s.set_write_timeout(10);
  s.set_keep_alive_timeout(5);
  s.set_payload_max_length(64 * 1024);
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which lets a
  // second controller bind the same port and take half the requests.
  s.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });

  auto guarded = [self](auto body) {
    return [self, body](const httplib::Request& req, httplib::Response& res) {
      if (!self->Authorized(req)) {
        res.status = 401;
        res.set_header("WWW-Authenticate", "Bearer");
        res.set_content(
            "unauthorized: this controller requires its shared token "
            "(header 'Authorization: Bearer <token>' or ?token=<token>)\n",
            "text/plain; charset=utf-8");
        return;
      }
      res.set_header("Cache-Control", "no-store");
      body(req, res);
    };
  };
  s.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain; charset=utf-8");
  });
  s.Get("/", guarded([](const httplib::Request&, httplib::Response& res) {
          res.set_content(kDashboardHtml, "text/html; charset=utf-8");
        }));
  s.Get("/api/status",
        guarded([self](const httplib::Request&, httplib::Response& res) {
          res.set_content(self->StatusJsonNow(), "application/json");
        }));
  s.Get("/metrics",
        guarded([self](const httplib::Request&, httplib::Response& res) {
          res.set_content(
              PrometheusText(self->sources.cluster(), self->sources.rpc()),
              "text/plain; version=0.0.4; charset=utf-8");
        }));

  if (port == 0) {
    impl->port = s.bind_to_any_port(host);
    if (impl->port <= 0) impl->port = 0;
  } else if (s.bind_to_port(host, port)) {
    impl->port = port;
  }
  if (impl->port == 0) {
    return absl::UnavailableError(
        absl::StrCat("--http: cannot listen on '", address,
                     "' (address in use, or not an address of this machine)"));
  }
  impl->thread = std::thread([self] { self->server.listen_after_bind(); });
  // stop() only reaches a server that runs: wait for it (bounded), so a
  // Stop() right after Start() cannot miss it and hang the join.
  const absl::Time ready_by = absl::Now() + absl::Seconds(10);
  while (!s.is_running() && absl::Now() < ready_by) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  if (!s.is_running()) {
    s.stop();
    impl->thread.join();
    return absl::InternalError(absl::StrCat("--http: the server on '", address,
                                            "' did not start within 10 s"));
  }
  spdlog::info("controller: dashboard and /metrics on http://{}:{}/", host,
               impl->port);
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

}  // namespace fusionrl
