// Turning a validated JobConfig into a ready JobContext (device, tokenizer,
// chat format, task, reward, policy), and writing a job's policy out as a
// Hugging Face directory. Shared by the RL, SFT and eval jobs.
#ifndef FUSIONRL_ENGINE_JOBS_JOB_SETUP_H_
#define FUSIONRL_ENGINE_JOBS_JOB_SETUP_H_

#include <c10/core/Device.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/rollout/job_context.h"
#include "fusionrl/config.h"
#include "fusionrl/tokenizer.h"
#include "template/chat_format.h"

namespace fusionrl {

// "cpu", "cuda", "cuda:1" -> a device this LibTorch build can use;
// FailedPrecondition (naming the `device` key) when CUDA is asked for but
// unavailable.
absl::StatusOr<c10::Device> ResolveDevice(const std::string& name);

// The job's tokenizer: model.tokenizer's directory, else model.hf_path's,
// else the character tokenizer.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadJobTokenizer(
    const ModelConfig& model);

// The chat renderer of a job: task.chat_template when set; else, for a
// model with a tokenizer directory, the model's own chat template
// (NotFound / InvalidArgument naming the file when it has none or it does
// not parse); else none (template/chat_format.h).
absl::StatusOr<ChatRenderer> ResolveChatRenderer(const JobConfig& config);

// Sets LibTorch's thread count, resolves the device (`device`, or
// config.device when empty), builds tokenizer, task, reward and policy
// (imports model.hf_path's weights), loads config.init_checkpoint. When
// `output_dir` is non-empty, creates it and writes the resolved config there
// as config.yaml.
absl::StatusOr<JobContext> PrepareJob(const JobConfig& config,
                                      const std::string& output_dir,
                                      const std::string& device = "");

// Writes `policy` as a Hugging Face directory at `out_dir` (ExportHfModel)
// with the job's tokenizer files, bos and stop ids, in
// config.run.export_dtype. A LoRA policy is written merged, and its adapter
// as a PEFT directory at "<out_dir>-lora".
absl::Status ExportJobPolicy(const JobConfig& config, const JobContext& ctx,
                             const PolicyModel& policy,
                             const std::string& out_dir);

// The base model a LoRA job's adapters apply to (adapter_config.json's
// base_model_name_or_path): init_checkpoint, else model.hf_path.
std::string LoraBaseModel(const JobConfig& config);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_JOBS_JOB_SETUP_H_
