// Hugging Face model directories <-> PolicyModel: import of safetensors
// weights (single file or sharded), export of a trained policy as a
// directory that transformers and vLLM load as it is.
//
// Names: FusionRL's parameters ("block3.attn.wq.weight") map one to one onto
// the Hugging Face names ("model.layers.3.self_attn.q_proj.weight"); the
// table is HfParameterName(). A tied model has no lm_head of its own, and
// none is written.
#ifndef FUSIONRL_ENGINE_MODEL_HF_MODEL_H_
#define FUSIONRL_ENGINE_MODEL_HF_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/model.h"

namespace fusionrl {

// The Hugging Face name of a FusionRL parameter name under `architecture`
// (model.architecture; "" is Llama's naming). A mixture of experts'
// router and experts ("block3.mlp.router.weight",
// "block3.mlp.expert5.w1.weight") are named as Qwen3MoeForCausalLM
// ("model.layers.3.mlp.gate.weight", "...mlp.experts.5.gate_proj.weight")
// or MixtralForCausalLM ("model.layers.3.block_sparse_moe.gate.weight",
// "...block_sparse_moe.experts.5.w1.weight") store them. InvalidArgument
// for a parameter with no counterpart under that architecture.
absl::StatusOr<std::string> HfParameterName(
    const std::string& name, const std::string& architecture = "");

// Loads the weights of the Hugging Face directory `dir` (model.safetensors,
// or the shards listed by model.safetensors.index.json) into `model`, whose
// config must describe the same architecture (ReadHfModelConfig). Stored
// F32 / BF16 / F16 tensors are converted to the model's dtype. Every
// parameter must be found with its exact shape, and every stored tensor must
// be used (except lm_head.weight of a tied model and rotary inv_freq
// buffers). Errors name the file and the tensor: missing, unexpected, shape
// mismatch, unsupported dtype, and every safetensors format error.
absl::Status LoadHfWeights(const std::string& dir, PolicyModel& model);

struct HfExportOptions {
  std::string dtype = "float32";  // float32 | bfloat16 (stored tensors)
  // Tensors per file: above this the weights are sharded with an index, as
  // transformers' save_pretrained does (its default is 5 GB).
  uint64_t max_shard_bytes = 5'000'000'000ULL;
  // Tokenizer files (tokenizer.json, tokenizer_config.json and, when
  // present, chat_template.jinja, special_tokens_map.json, vocab.json,
  // merges.txt, added_tokens.json) are copied from here; "" = none.
  std::string tokenizer_dir;
  // The Hugging Face directory the model was imported from ("" = none): its
  // generation_config.json is kept (the authors' sampling defaults:
  // temperature, top_p, top_k, do_sample, ...), with bos/eos set below.
  std::string source_dir;
  int bos_token_id = -1;  // config.json / generation_config.json
  std::vector<int> eos_token_ids;
  // config.json's max_position_embeddings: the imported model's context
  // (a job's shorter model.max_seq_len must not shrink it); 0 = the
  // model's max_seq_len.
  int max_position_embeddings = 0;
};

// Writes `model` as a Hugging Face directory at `out_dir`: config.json,
// generation_config.json, model.safetensors (or shards + index) and the
// tokenizer files. Assembled in "<out_dir>.tmp" and renamed into place; an
// existing `out_dir` is replaced only once the new one is complete.
absl::Status ExportHfModel(const PolicyModel& model, const std::string& out_dir,
                           const HfExportOptions& options);

// PEFT LoRA adapters (model.lora; docs/models.md "LoRA").
//
// The PEFT name of a FusionRL adapter tensor: "block3.attn.wq.lora_A" ->
// "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight" (A is
// [r, in], B [out, r], as PEFT stores them).
absl::StatusOr<std::string> PeftTensorName(const std::string& name);

// Loads the adapters of the PEFT directory `dir` (adapter_config.json +
// adapter_model.safetensors) into the LoRA `model`, whose model.lora must
// say the adapter's r and target_modules (the config layer takes them from
// model.lora_path). Stored F32 / BF16 / F16 tensors become float32; names
// with PEFT's adapter name (".lora_A.default.weight") are read too. Errors
// name the file and the tensor: missing, unexpected, shape mismatch.
absl::Status LoadPeftAdapter(const std::string& dir, PolicyModel& model);

// Writes the LoRA `model`'s adapters as a PEFT adapter directory:
// adapter_config.json (peft_type LORA, r, lora_alpha, target_modules,
// base_model_name_or_path = `base_model`) and adapter_model.safetensors
// (float32). Assembled in "<out_dir>.tmp" and renamed into place.
absl::Status ExportPeftAdapter(const PolicyModel& model,
                               const std::string& out_dir,
                               const std::string& base_model);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_MODEL_HF_MODEL_H_
