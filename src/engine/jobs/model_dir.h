// A policy with its tokenizer from a directory on disk, for the commands that
// take a model rather than a job (`fusionrl generate`, `fusionrl export`):
// either a Hugging Face directory (config.json + safetensors + tokenizer
// files) or a FusionRL checkpoint (meta.json + model.pt; its tokenizer is the
// one its run used, recorded in meta.json).
#ifndef FUSIONRL_ENGINE_JOBS_MODEL_DIR_H_
#define FUSIONRL_ENGINE_JOBS_MODEL_DIR_H_

#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "fusionrl/tokenizer.h"
#include "template/chat_format.h"

namespace fusionrl {

struct ModelDirOptions {
  c10::Device device = c10::Device("cpu");
  std::string dtype = "float32";  // compute dtype
  int max_seq_len = 0;            // rotary table length; 0 = the stored model's
  std::string tokenizer;          // tokenizer directory; "" = the model's own
  // A PEFT LoRA adapter directory applied to the model (generate --lora).
  std::string lora;
  // Keep a LoRA model unmerged (export writes its adapters); by default it
  // is its CloneFrozen() view (merged in float32, unmerged in bfloat16).
  bool keep_lora_unmerged = false;
};

struct LoadedModel {
  std::unique_ptr<PolicyModel> policy;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string tokenizer_dir;  // "" for the character tokenizer
  std::string hf_path;        // the Hugging Face directory it came from
  std::string lora_base;      // a LoRA model: the base its adapters apply to
  int bos_token_id = -1;      // config / generation_config's, else tokenizer
  std::vector<int> eos_token_ids;  // generation stops at any of these
  // The Hugging Face config's max_position_embeddings, 0 when unknown.
  int max_position_embeddings = 0;
  // The model's own chat template (template/chat_format.h); the error's text
  // in chat_error when it has none or it does not parse.
  ChatRenderer chat;
  std::string chat_error;
};

// Loads `dir` (a Hugging Face directory or a FusionRL checkpoint). Errors
// name the directory and what is wrong with it.
absl::StatusOr<LoadedModel> LoadModelDir(const std::string& dir,
                                         const ModelDirOptions& options);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_JOBS_MODEL_DIR_H_
