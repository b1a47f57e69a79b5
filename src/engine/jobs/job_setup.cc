#include "engine/jobs/job_setup.h"

#include <ATen/Parallel.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string_view>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "core/hf_config.h"
#include "core/metrics.h"
#include "core/status_macros.h"
#include "engine/kernels/intra_op_threads.h"
#include "engine/model/hf_model.h"
#include "engine/train/checkpoint.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "tasks/rewards.h"

namespace fusionrl {

absl::StatusOr<c10::Device> ResolveDevice(const std::string& name) {
  c10::Device device("cpu");
  try {
    device = c10::Device(name);
  } catch (const c10::Error&) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: '", name, "' is not a device name"));
  }
  if (device.is_cuda()) {
    if (!torch::cuda::is_available()) {
      return absl::FailedPreconditionError(
          absl::StrCat("device: '", name,
                       "' requested, but this LibTorch build has no "
                       "CUDA or no GPU is visible"));
    }
    const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
    if (device.has_index() && device.index() >= count) {
      return absl::FailedPreconditionError(
          absl::StrCat("device: '", name, "' requested, but only ", count,
                       " GPU(s) visible"));
    }
  } else if (!device.is_cpu()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device: '", name, "' is not supported (use cpu or cuda)"));
  }
  return device;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadJobTokenizer(
    const ModelConfig& model) {
  const std::string& dir =
      !model.tokenizer.empty() ? model.tokenizer : model.hf_path;
  if (dir.empty()) return MakeCharTokenizer();
  auto tokenizer = LoadTokenizer(dir);
  if (!tokenizer.ok()) {
    return absl::Status(
        tokenizer.status().code(),
        absl::StrCat(
            model.tokenizer.empty() ? "model.hf_path: " : "model.tokenizer: ",
            tokenizer.status().message()));
  }
  return tokenizer;
}

absl::StatusOr<ChatRenderer> ResolveChatRenderer(const JobConfig& config) {
  const ModelConfig& m = config.model;
  return ChatRenderer::ForJob(config.task.chat_template,
                              !m.tokenizer.empty() ? m.tokenizer : m.hf_path);
}

absl::StatusOr<JobContext> PrepareJob(const JobConfig& config,
                                      const std::string& output_dir,
                                      const std::string& device) {
  SetIntraOpThreads(config.num_threads);
  JobContext ctx;
  FUSIONRL_ASSIGN_OR_RETURN(
      ctx.device, ResolveDevice(device.empty() ? config.device : device));
  FUSIONRL_ASSIGN_OR_RETURN(ctx.tokenizer, LoadJobTokenizer(config.model));
  FUSIONRL_ASSIGN_OR_RETURN(ctx.chat, ResolveChatRenderer(config));
  ctx.system_prompt = config.task.system_prompt;
  FUSIONRL_ASSIGN_OR_RETURN(ctx.task,
                            TaskRegistry::Global().Create(config.task));
  const std::string reward_name = config.task.reward.empty()
                                      ? ctx.task->default_reward()
                                      : config.task.reward;
  FUSIONRL_ASSIGN_OR_RETURN(ctx.reward,
                            RewardRegistry::Global().Create(reward_name));

  // Stop ids: the tokenizer's eos, the model's generation eos list, the
  // chat format's end of turn.
  auto add_stop = [&](int id) {
    if (id >= 0 && std::find(ctx.stop_ids.begin(), ctx.stop_ids.end(), id) ==
                       ctx.stop_ids.end()) {
      ctx.stop_ids.push_back(id);
    }
  };
  add_stop(ctx.tokenizer->eos_id());
  if (!config.model.hf_path.empty()) {
    FUSIONRL_ASSIGN_OR_RETURN(HfModelInfo info,
                              ReadHfModelConfig(config.model.hf_path));
    for (int id : info.eos_token_ids) add_stop(id);
  }
  if (!ctx.chat.end_of_turn().empty()) {
    add_stop(ctx.tokenizer->TokenToId(ctx.chat.end_of_turn()));
  }

  ctx.env = config.env;
  if (!config.env.name.empty()) {
    // The registry's and the factories' errors name their key (env.name,
    // env.address).
    FUSIONRL_ASSIGN_OR_RETURN(ctx.environment,
                              EnvironmentRegistry::Global().Create(config.env));
    FUSIONRL_ASSIGN_OR_RETURN(
        ctx.tool_format, ResolveToolFormat(config.env.tool_format, ctx.chat));
  }

  const int vocab = config.model.vocab_size > 0 ? config.model.vocab_size
                                                : ctx.tokenizer->vocab_size();
  if (vocab < ctx.tokenizer->vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.vocab_size: ", vocab, " is smaller than the tokenizer's ",
        ctx.tokenizer->vocab_size(), " ids"));
  }
  FUSIONRL_ASSIGN_OR_RETURN(
      ctx.policy, PolicyModel::Create(config.model, vocab, ctx.device,
                                      static_cast<uint64_t>(config.seed)));
  // A LoRA job's base is hf_path's weights even with an init_checkpoint
  // that holds adapters only (a full one replaces them below).
  if (!config.model.hf_path.empty() &&
      (config.init_checkpoint.empty() || ctx.policy->lora())) {
    if (auto status = LoadHfWeights(config.model.hf_path, *ctx.policy);
        !status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("model.hf_path: ", status.message()));
    }
  }
  if (!config.init_checkpoint.empty()) {
    auto meta = ReadCheckpoint(config.init_checkpoint, *ctx.policy, nullptr);
    if (!meta.ok()) {
      return absl::Status(
          meta.status().code(),
          absl::StrCat("init_checkpoint: ", meta.status().message()));
    }
  }
  if (!config.model.lora_path.empty()) {
    if (auto status = LoadPeftAdapter(config.model.lora_path, *ctx.policy);
        !status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("model.lora_path: ", status.message()));
    }
  }
  if (!output_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(output_dir, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat(
          "output_dir: cannot create '", output_dir, "': ", ec.message()));
    }
    FUSIONRL_RETURN_IF_ERROR(
        WriteFileAtomic(output_dir + "/config.yaml", JobConfigToYaml(config)));
  }
  return ctx;
}

absl::Status ExportJobPolicy(const JobConfig& config, const JobContext& ctx,
                             const PolicyModel& policy,
                             const std::string& out_dir) {
  HfExportOptions options;
  options.dtype = config.run.export_dtype;
  options.tokenizer_dir = !config.model.tokenizer.empty()
                              ? config.model.tokenizer
                              : config.model.hf_path;
  options.source_dir = config.model.hf_path;
  options.bos_token_id = ctx.tokenizer->bos_id();
  if (!config.model.hf_path.empty()) {
    FUSIONRL_ASSIGN_OR_RETURN(HfModelInfo info,
                              ReadHfModelConfig(config.model.hf_path));
    if (info.bos_token_id >= 0) options.bos_token_id = info.bos_token_id;
    options.max_position_embeddings = info.max_position_embeddings;
  }
  options.eos_token_ids = ctx.stop_ids;
  // LoRA: the adapter as PEFT writes it (<out_dir>-lora), and the merged
  // model, which loads as it is, at out_dir.
  std::unique_ptr<PolicyModel> merged;
  if (policy.lora()) {
    const std::string lora_dir = out_dir + "-lora";
    if (auto status =
            ExportPeftAdapter(policy, lora_dir, LoraBaseModel(config));
        !status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("run.export_final: ", status.message()));
    }
    spdlog::info("[{}] exported the LoRA adapter (PEFT): {}", config.name,
                 lora_dir);
    merged = policy.CloneFrozen();
  }
  auto status = ExportHfModel(merged ? *merged : policy, out_dir, options);
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("run.export_final: ", status.message()));
  }
  spdlog::info("[{}] exported the policy as a Hugging Face model{}: {}",
               config.name, merged ? " (LoRA merged)" : "", out_dir);
  return absl::OkStatus();
}

std::string LoraBaseModel(const JobConfig& config) {
  if (!config.init_checkpoint.empty()) return config.init_checkpoint;
  return config.model.hf_path;
}

}  // namespace fusionrl
