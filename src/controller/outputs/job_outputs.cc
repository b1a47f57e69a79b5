#include "controller/outputs/job_outputs.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/job_summary.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace fusionrl {
namespace {

// Keeps the metrics records of steps <= `last_step` (a resumed job rewrites
// the steps after its checkpoint).
absl::Status TruncateMetrics(const std::string& path, int64_t last_step) {
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() <= last_step) {
      kept += line + "\n";
    }
  }
  return WriteFileAtomic(path, kept);
}

// The last value named `name` (a later duplicate wins, as in the JSON
// object), 0 when absent or not finite.
double Find(const MetricFields& metrics, const std::string& name) {
  for (auto it = metrics.rbegin(); it != metrics.rend(); ++it) {
    if (it->first == name) return std::isfinite(it->second) ? it->second : 0.0;
  }
  return 0;
}

double Find(const nlohmann::ordered_json& rec, const std::string& name) {
  auto it = rec.find(name);
  return it != rec.end() && it->is_number() ? it->get<double>() : 0.0;
}

}  // namespace

JobOutputs::~JobOutputs() = default;

void JobOutputs::Queue(Op op) {
  absl::MutexLock lock(&queue_mu_);
  queue_.push_back(std::move(op));
  ++queued_;
}

void JobOutputs::Open(const std::string& job_id, OpenSpec spec) {
  Op op;
  op.kind = Op::Kind::kOpen;
  op.job_id = job_id;
  op.open = std::move(spec);
  Queue(std::move(op));
}

void JobOutputs::Append(const std::string& job_id, std::string json_line) {
  Op op;
  op.kind = Op::Kind::kAppend;
  op.job_id = job_id;
  op.line = std::move(json_line);
  Queue(std::move(op));
}

void JobOutputs::RollBack(const std::string& job_id, int64_t last_step) {
  Op op;
  op.kind = Op::Kind::kRollBack;
  op.job_id = job_id;
  op.last_step = last_step;
  Queue(std::move(op));
}

void JobOutputs::SaveRunTotals(const std::string& job_id,
                               std::string checkpoint_dir, RunTotals totals) {
  Op op;
  op.kind = Op::Kind::kRunTotals;
  op.job_id = job_id;
  op.checkpoint_dir = std::move(checkpoint_dir);
  op.totals = totals;
  Queue(std::move(op));
}

void JobOutputs::Close(const std::string& job_id,
                       std::optional<JobSummary> summary) {
  Op op;
  op.kind = Op::Kind::kClose;
  op.job_id = job_id;
  op.summary = std::move(summary);
  Queue(std::move(op));
}

int64_t JobOutputs::pending() const {
  absl::MutexLock lock(&queue_mu_);
  return queued_ - performed_;
}

void JobOutputs::Flush(absl::FunctionRef<void(const Result&)> on_result) {
  {
    absl::MutexLock lock(&queue_mu_);
    if (performed_ == queued_) return;  // nothing queued, nothing in flight
  }
  // Whoever writes now may hold ops queued before this call: wait for it,
  // then write what is left.
  absl::MutexLock writer(&write_mu_);
  for (;;) {
    std::deque<Op> batch;
    {
      absl::MutexLock lock(&queue_mu_);
      if (queue_.empty()) return;
      batch.swap(queue_);
    }
    for (Op& op : batch) {
      std::optional<Result> result = Perform(op);
      if (result) on_result(*result);
      // Counted once its result is handed over, so a Flush that returns
      // early never returns before a Close it raced with is published.
      absl::MutexLock lock(&queue_mu_);
      ++performed_;
    }
  }
}

namespace {

// Every number of a metrics record but "step", as TensorBoard scalars of
// that step.
absl::Status WriteScalars(TensorBoardWriter& tb, const std::string& line) {
  nlohmann::json j =
      nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number()) {
    return absl::InvalidArgumentError("a record without a step");
  }
  std::vector<std::pair<std::string, double>> scalars;
  for (const auto& [key, value] : j.items()) {
    if (key != "step" && value.is_number()) {
      scalars.emplace_back(key, value.get<double>());
    }
  }
  return tb.WriteScalars(j["step"].get<int64_t>(),
                         absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()),
                         scalars);
}

}  // namespace

std::optional<JobOutputs::Result> JobOutputs::Perform(Op& op) {
  switch (op.kind) {
    case Op::Kind::kOpen: {
      Result r;
      r.job_id = op.job_id;
      r.kind = Result::Kind::kOpened;
      const std::string& out = op.open.output_dir;
      std::error_code ec;
      std::filesystem::create_directories(out + "/checkpoints", ec);
      if (ec) {
        r.status = absl::UnavailableError(absl::StrCat(
            "output_dir: cannot create '", out, "': ", ec.message()));
        return r;
      }
      r.status = WriteFileAtomic(out + "/config.yaml", op.open.config_yaml);
      if (!r.status.ok()) return r;
      const std::string path = out + "/metrics.jsonl";
      if (op.open.resume_after_step.has_value()) {
        r.status = TruncateMetrics(path, *op.open.resume_after_step);
        if (!r.status.ok()) return r;
      }
      absl::StatusOr<std::unique_ptr<MetricsLog>> log = MetricsLog::Open(
          path, /*truncate=*/!op.open.resume_after_step.has_value());
      if (!log.ok()) {
        r.status = log.status();
        return r;
      }
      logs_[op.job_id] = *std::move(log);
      tensorboard_.erase(op.job_id);
      if (op.open.tensorboard) {
        absl::StatusOr<std::unique_ptr<TensorBoardWriter>> tb =
            TensorBoardWriter::Open(
                out + "/tensorboard",
                absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
        if (!tb.ok()) {
          logs_.erase(op.job_id);
          r.status = absl::Status(
              tb.status().code(),
              absl::StrCat("run.tensorboard: ", tb.status().message()));
          return r;
        }
        tensorboard_[op.job_id] = *std::move(tb);
      }
      return r;
    }
    case Op::Kind::kAppend: {
      auto it = logs_.find(op.job_id);
      if (it == logs_.end()) return std::nullopt;  // its Open failed
      absl::Status s = it->second->AppendLine(op.line);
      if (!s.ok()) {
        spdlog::warn("[{}] metrics: {}", op.job_id, std::string(s.message()));
      }
      if (auto tb = tensorboard_.find(op.job_id); tb != tensorboard_.end()) {
        s = WriteScalars(*tb->second, op.line);
        if (!s.ok()) {
          spdlog::warn("[{}] tensorboard: {}", op.job_id,
                       std::string(s.message()));
        }
      }
      return std::nullopt;
    }
    case Op::Kind::kRollBack: {
      auto it = logs_.find(op.job_id);
      if (it == logs_.end()) return std::nullopt;  // its Open failed
      // Close, keep the records up to the step, open for appending again.
      const std::string path = it->second->path();
      it->second.reset();
      absl::Status s = TruncateMetrics(path, op.last_step);
      absl::StatusOr<std::unique_ptr<MetricsLog>> log =
          MetricsLog::Open(path, /*truncate=*/false);
      if (log.ok()) {
        it->second = *std::move(log);
      } else {
        logs_.erase(it);
        s.Update(log.status());
      }
      if (!s.ok()) {
        spdlog::warn("[{}] metrics roll-back to step {}: {}", op.job_id,
                     op.last_step, std::string(s.message()));
      }
      return std::nullopt;
    }
    case Op::Kind::kRunTotals: {
      absl::Status s = WriteFileAtomic(op.checkpoint_dir + "/" + kRunTotalsFile,
                                       RunTotalsToJson(op.totals));
      if (!s.ok()) {
        spdlog::warn("[{}] run totals: {}", op.job_id,
                     std::string(s.message()));
      }
      return std::nullopt;
    }
    case Op::Kind::kClose: {
      Result r;
      r.job_id = op.job_id;
      r.kind = Result::Kind::kClosed;
      auto it = logs_.find(op.job_id);
      const bool opened = it != logs_.end();
      if (opened) logs_.erase(it);
      tensorboard_.erase(op.job_id);
      if (op.summary.has_value()) {
        if (!opened) {
          r.status = absl::FailedPreconditionError(
              absl::StrCat("the outputs of ", op.job_id, " were never opened"));
        } else {
          r.status = WriteSummary(*op.summary);
          if (r.status.ok()) {
            r.wrote_summary = true;
            // Kept for status replies (read once, not on every call).
            r.summary_json =
                ReadTextFile(op.summary->summary_path, "summary").value_or("");
          }
        }
      }
      return r;
    }
  }
  return std::nullopt;
}

StepRecordLine FormatStepRecord(const MetricFields& metrics,
                                const std::string& metrics_json,
                                const MetricFields& job_fields) {
  StepRecordLine out;
  if (!metrics.empty()) {
    MetricRecord rec = metrics;
    for (const auto& field : job_fields) {
      auto it = std::find_if(rec.begin(), rec.end(), [&](const auto& f) {
        return f.first == field.first;
      });
      if (it != rec.end()) {
        it->second = field.second;
      } else {
        rec.push_back(field);
      }
    }
    out.json = MetricRecordToJson(rec);
    out.response_len_mean = Find(metrics, "response_len_mean");
    out.kl = Find(metrics, "kl");
    return out;
  }
  if (metrics_json.empty()) return out;
  auto rec = nlohmann::ordered_json::parse(metrics_json, nullptr,
                                           /*allow_exceptions=*/false);
  if (!rec.is_object()) return out;
  // Formatted by the typed form's rule, then merged as the typed form
  // merges them (a key already there keeps its place, new ones go last).
  if (!job_fields.empty()) {
    rec.update(nlohmann::ordered_json::parse(MetricRecordToJson(job_fields)));
  }
  out.json = rec.dump();
  out.response_len_mean = Find(rec, "response_len_mean");
  out.kl = Find(rec, "kl");
  return out;
}

}  // namespace fusionrl
