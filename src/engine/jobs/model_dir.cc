#include "engine/jobs/model_dir.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/hf_config.h"
#include "core/status_macros.h"
#include "engine/jobs/job_setup.h"
#include "engine/model/hf_model.h"
#include "engine/train/checkpoint.h"

namespace fusionrl {
namespace fs = std::filesystem;

absl::StatusOr<LoadedModel> LoadModelDir(const std::string& dir,
                                         const ModelDirOptions& options) {
  LoadedModel out;
  ModelConfig m;
  int vocab = 0;
  const bool hf = fs::exists(fs::path(dir) / "config.json");
  const bool checkpoint = fs::exists(fs::path(dir) / "meta.json");
  if (!hf && !checkpoint) {
    return absl::NotFoundError(
        absl::StrCat("'", dir,
                     "' is neither a Hugging Face model directory (no "
                     "config.json) nor a FusionRL checkpoint (no meta.json)"));
  }
  if (hf) {
    FUSIONRL_ASSIGN_OR_RETURN(HfModelInfo info, ReadHfModelConfig(dir));
    m = info.model;
    vocab = m.vocab_size;
    m.hf_path = dir;
    out.hf_path = dir;
    out.bos_token_id = info.bos_token_id;
    out.eos_token_ids = info.eos_token_ids;
    out.max_position_embeddings = info.max_position_embeddings;
    m.max_seq_len =
        info.max_position_embeddings > 0 ? info.max_position_embeddings : 2048;
  } else {
    FUSIONRL_ASSIGN_OR_RETURN(CheckpointModel cm, ReadCheckpointModel(dir));
    m = cm.model;
    vocab = cm.vocab_size;
    out.hf_path = cm.hf_path;
    out.lora_base = cm.lora_base;
    if (!cm.hf_path.empty() &&
        fs::exists(fs::path(cm.hf_path) / "config.json")) {
      FUSIONRL_ASSIGN_OR_RETURN(HfModelInfo info,
                                ReadHfModelConfig(cm.hf_path));
      out.bos_token_id = info.bos_token_id;
      out.eos_token_ids = info.eos_token_ids;
      out.max_position_embeddings = info.max_position_embeddings;
    }
  }
  // A checkpoint keeps the length it was trained with (its meta.json
  // records it and loading checks it).
  if (options.max_seq_len > 0 && hf) m.max_seq_len = options.max_seq_len;
  m.dtype = options.dtype;
  if (!options.tokenizer.empty()) m.tokenizer = options.tokenizer;
  out.tokenizer_dir = !m.tokenizer.empty() ? m.tokenizer : m.hf_path;
  FUSIONRL_ASSIGN_OR_RETURN(out.tokenizer, LoadJobTokenizer(m));
  if (out.tokenizer->eos_id() >= 0 &&
      std::find(out.eos_token_ids.begin(), out.eos_token_ids.end(),
                out.tokenizer->eos_id()) == out.eos_token_ids.end()) {
    out.eos_token_ids.insert(out.eos_token_ids.begin(),
                             out.tokenizer->eos_id());
  }
  if (out.bos_token_id < 0) out.bos_token_id = out.tokenizer->bos_id();
  if (!out.tokenizer_dir.empty()) {
    JobConfig job;
    job.model = m;
    auto chat = ResolveChatRenderer(job);
    if (chat.ok()) {
      out.chat = *chat;
    } else {
      out.chat_error = std::string(chat.status().message());
    }
  }
  if (!options.lora.empty()) {
    if (LoraEnabled(m)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lora: '", dir, "' holds LoRA adapters already"));
    }
    absl::StatusOr<PeftAdapterInfo> adapter =
        ReadPeftAdapterConfig(options.lora);
    if (!adapter.ok()) {
      return absl::Status(adapter.status().code(),
                          absl::StrCat("--lora: ", adapter.status().message()));
    }
    m.lora = adapter->lora;
    out.lora_base = dir;
  }
  FUSIONRL_ASSIGN_OR_RETURN(out.policy,
                            PolicyModel::Create(m, vocab, options.device, 0));
  if (hf) {
    FUSIONRL_RETURN_IF_ERROR(LoadHfWeights(dir, *out.policy));
  } else {
    if (LoraEnabled(m)) {
      // model.pt holds the adapters: the base comes first.
      const std::string& base = out.lora_base;
      if (fs::exists(fs::path(base) / "config.json")) {
        FUSIONRL_RETURN_IF_ERROR(LoadHfWeights(base, *out.policy));
      } else if (fs::exists(fs::path(base) / "meta.json")) {
        FUSIONRL_RETURN_IF_ERROR(
            ReadCheckpoint(base, *out.policy, nullptr).status());
      } else {
        return absl::NotFoundError(absl::StrCat(
            "checkpoint '", dir, "' holds LoRA adapters for the base model '",
            base,
            "', which is not a Hugging Face directory or a checkpoint "
            "here"));
      }
    }
    FUSIONRL_RETURN_IF_ERROR(
        ReadCheckpoint(dir, *out.policy, nullptr).status());
  }
  if (!options.lora.empty()) {
    if (absl::Status s = LoadPeftAdapter(options.lora, *out.policy); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("--lora: ", s.message()));
    }
  }
  if (out.policy->lora() && !options.keep_lora_unmerged) {
    out.policy = out.policy->CloneFrozen();
  }
  out.policy->set_training(false);
  return out;
}

}  // namespace fusionrl
