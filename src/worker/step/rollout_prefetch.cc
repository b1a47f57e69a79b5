#include "worker/step/rollout_prefetch.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "core/metrics.h"
#include "fusionrl/v1/checkpoint.pb.h"

namespace fusionrl {
namespace fs = std::filesystem;

std::string RolloutPrefetchPath(const std::string& checkpoints_dir,
                                int64_t step, int rank) {
  return (fs::path(checkpoints_dir) / "rollout" / absl::StrCat("step_", step) /
          absl::StrCat("card_", rank, ".pb"))
      .string();
}

absl::Status WriteRolloutPrefetch(const std::string& path,
                                  const RolloutPrefetch& prefetch) {
  v1::RolloutPrefetch out;
  out.set_checkpoint_step(prefetch.checkpoint_step);
  out.set_weights_crc32c(prefetch.weights_crc32c);
  out.set_rank(prefetch.rank);
  out.set_max_policy_lag(prefetch.max_policy_lag);
  out.set_prompts_per_step(prefetch.prompts_per_step);
  out.set_base_step(prefetch.base_step);
  out.mutable_base_groups()->Add(prefetch.base_groups.begin(),
                                 prefetch.base_groups.end());
  out.set_frame_version(prefetch.frame_version);
  out.set_partial_rollout_tokens(prefetch.partial_rollout_tokens);
  out.set_steps_per_version(prefetch.steps_per_version);
  for (const auto& [step, batch] : prefetch.batches) {
    v1::PrefetchedBatch* b = out.add_batches();
    b->set_step(step);
    b->mutable_groups()->Add(batch.groups.begin(), batch.groups.end());
    b->set_seconds(batch.seconds);
    b->set_gate_wait_seconds(batch.gate_wait_seconds);
    b->mutable_unfinished()->Add(batch.unfinished.begin(),
                                 batch.unfinished.end());
    for (const Sample& s : batch.samples) {
      v1::PrefetchedSample* p = b->add_samples();
      p->set_group_id(s.group_id);
      p->set_problem_index(s.problem_index);
      p->mutable_prompt_ids()->Add(s.prompt_ids.begin(), s.prompt_ids.end());
      p->mutable_response_ids()->Add(s.response_ids.begin(),
                                     s.response_ids.end());
      p->mutable_behaviour_logp()->Add(s.behaviour_logp.begin(),
                                       s.behaviour_logp.end());
      p->set_behaviour_version(s.behaviour_version);
      p->set_finished(s.finished);
      p->set_reward(s.reward);
      p->set_correct(s.correct);
      p->mutable_token_versions()->Add(s.token_versions.begin(),
                                       s.token_versions.end());
      p->set_loss_mask(std::string(s.loss_mask.begin(), s.loss_mask.end()));
      p->set_routes(std::string(s.routes.begin(), s.routes.end()));
      p->set_turns(s.episode.turns);
      p->set_tool_calls(s.episode.tool_calls);
      p->set_tool_errors(s.episode.tool_errors);
      p->set_env_seconds(s.episode.env_seconds);
      p->set_env_failed(s.episode.env_failed);
      p->mutable_env_metrics()->insert(s.episode.metrics.begin(),
                                       s.episode.metrics.end());
    }
  }
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("rollout prefetch: cannot create the directory of '", path,
                     "': ", ec.message()));
  }
  return WriteFileAtomic(path, out.SerializeAsString());
}

absl::StatusOr<RolloutPrefetch> ReadRolloutPrefetch(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadTextFile(path, "rollout prefetch");
  if (!bytes.ok()) return bytes.status();
  v1::RolloutPrefetch in;
  if (!in.ParseFromString(*bytes)) {
    return absl::DataLossError(absl::StrCat(
        "rollout prefetch '", path, "': not a RolloutPrefetch message"));
  }
  RolloutPrefetch out;
  out.checkpoint_step = in.checkpoint_step();
  out.weights_crc32c = in.weights_crc32c();
  out.rank = in.rank();
  out.max_policy_lag = in.max_policy_lag();
  out.prompts_per_step = in.prompts_per_step();
  out.base_step = in.base_step();
  out.base_groups.assign(in.base_groups().begin(), in.base_groups().end());
  out.frame_version = in.frame_version();
  out.partial_rollout_tokens = in.partial_rollout_tokens();
  out.steps_per_version = std::max(1, in.steps_per_version());
  int64_t expected = out.checkpoint_step + 1;
  for (const v1::PrefetchedBatch& b : in.batches()) {
    if (b.step() != expected) {
      return absl::DataLossError(absl::StrCat(
          "rollout prefetch '", path, "': batch of step ", b.step(),
          " where step ", expected, " was expected (checkpoint step ",
          out.checkpoint_step, ")"));
    }
    ++expected;
    RolloutBatch& batch = out.batches[b.step()];
    batch.groups.assign(b.groups().begin(), b.groups().end());
    batch.seconds = b.seconds();
    batch.gate_wait_seconds = b.gate_wait_seconds();
    batch.unfinished.assign(b.unfinished().begin(), b.unfinished().end());
    for (const v1::PrefetchedSample& p : b.samples()) {
      Sample& s = batch.samples.emplace_back();
      s.group_id = p.group_id();
      s.problem_index = p.problem_index();
      s.prompt_ids.assign(p.prompt_ids().begin(), p.prompt_ids().end());
      s.response_ids.assign(p.response_ids().begin(), p.response_ids().end());
      s.behaviour_logp.assign(p.behaviour_logp().begin(),
                              p.behaviour_logp().end());
      s.behaviour_version = p.behaviour_version();
      s.finished = p.finished();
      s.reward = p.reward();
      s.correct = p.correct();
      s.token_versions.assign(p.token_versions().begin(),
                              p.token_versions().end());
      s.loss_mask.assign(p.loss_mask().begin(), p.loss_mask().end());
      s.routes.assign(p.routes().begin(), p.routes().end());
      s.episode.turns = p.turns();
      s.episode.tool_calls = p.tool_calls();
      s.episode.tool_errors = p.tool_errors();
      s.episode.env_seconds = p.env_seconds();
      s.episode.env_failed = p.env_failed();
      s.episode.metrics.insert(p.env_metrics().begin(), p.env_metrics().end());
    }
    for (const int32_t j : batch.unfinished) {
      if (j < 0 || j >= static_cast<int32_t>(batch.samples.size())) {
        return absl::DataLossError(absl::StrCat(
            "rollout prefetch '", path, "': step ", b.step(),
            " lists unfinished sample ", j, " of ", batch.samples.size()));
      }
    }
    batch.Recount();
  }
  return out;
}

}  // namespace fusionrl
