#include "cli/model_cli.h"

#include <ATen/Parallel.h>

#include <cstdio>
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "cli/common/exit_codes.h"
#include "engine/jobs/job_setup.h"
#include "engine/jobs/model_dir.h"
#include "engine/kernels/intra_op_threads.h"
#include "engine/model/hf_model.h"
#include "engine/rollout/rollout.h"
#include "nlohmann/json.hpp"

namespace fusionrl::cli {

ModelCommands AddModelCommands(CLI::App& app, GenerateArgs& g, ExportArgs& e) {
  ModelCommands c;
  c.generate = app.add_subcommand(
      "generate", "sample a completion from a model directory or checkpoint");
  c.generate
      ->add_option("--model,-m", g.model,
                   "Hugging Face model directory or FusionRL checkpoint")
      ->required();
  c.generate->add_option("--prompt,-p", g.prompt, "prompt text")->required();
  c.generate
      ->add_option_function<int>(
          "--max-new-tokens,-n",
          [&g](const int& n) {
            g.max_new_tokens = n;
            g.max_new_tokens_set = true;
          },
          "response length cap in tokens (default 64, lowered to fit the "
          "model's context)")
      ->check(CLI::Range(1, 1 << 20));
  c.generate
      ->add_option("--temperature,-t", g.temperature,
                   "sampling temperature; 0 = greedy")
      ->check(CLI::Range(0.0, 100.0));
  c.generate->add_option("--top-k", g.top_k, "0 = off")
      ->check(CLI::Range(0, 1 << 30));
  c.generate->add_option("--top-p", g.top_p, "1 = off")
      ->check(CLI::Range(0.0, 1.0));
  c.generate->add_option("--seed", g.seed, "sampling seed");
  c.generate->add_flag("--chat", g.chat,
                       "wrap the prompt as a user message in the model's "
                       "chat format");
  c.generate->add_option("--system", g.system, "with --chat: a system message");
  c.generate->add_flag("--json", g.json,
                       "print {\"prompt_ids\", \"ids\", \"text\"} as one "
                       "JSON line");
  c.generate->add_option("--device", g.device, "cpu, cuda, cuda:N");
  c.generate->add_option("--dtype", g.dtype, "compute dtype")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  c.generate->add_option("--tokenizer", g.tokenizer,
                         "tokenizer directory (default: the model's)");
  c.generate->add_option("--threads", g.threads, "LibTorch threads")
      ->check(CLI::Range(0, 1024));
  c.generate->add_option("--lora", g.lora,
                         "a PEFT LoRA adapter directory to apply (merged)");

  c.export_ = app.add_subcommand(
      "export",
      "write a checkpoint as a Hugging Face model directory (transformers, "
      "vLLM)");
  c.export_
      ->add_option("source", e.source,
                   "FusionRL checkpoint (or Hugging Face directory)")
      ->required();
  c.export_->add_option("--out,-o", e.out, "output directory")->required();
  c.export_->add_option("--dtype", e.dtype, "stored dtype")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  c.export_->add_option("--tokenizer", e.tokenizer,
                        "copy the tokenizer files from here (default: the "
                        "run's tokenizer)");
  c.export_
      ->add_option("--max-shard-mb", e.max_shard_mb,
                   "shard the weights above this size (MB, 10^6 bytes)")
      ->check(CLI::Range(1.0, 1e9));
  c.export_->add_flag("--merge", e.merge,
                      "a LoRA checkpoint: write the merged model (base + "
                      "alpha/r B A) instead of the PEFT adapter");
  return c;
}

int RunGenerate(const GenerateArgs& args) {
  if (args.threads > 0) SetIntraOpThreads(args.threads);
  auto device = ResolveDevice(args.device);
  if (!device.ok()) return Fail(device.status());
  ModelDirOptions options;
  options.device = *device;
  options.dtype = args.dtype;
  options.tokenizer = args.tokenizer;
  options.lora = args.lora;
  auto loaded = LoadModelDir(args.model, options);
  if (!loaded.ok()) return Fail(loaded.status());
  LoadedModel& m = *loaded;

  std::string text = args.prompt;
  std::vector<int> stop = m.eos_token_ids;
  if (args.chat) {
    if (!m.chat_error.empty()) {
      return Fail(
          absl::InvalidArgumentError(absl::StrCat("--chat: ", m.chat_error)));
    }
    std::vector<ChatMessage> messages;
    if (!args.system.empty()) messages.push_back({"system", args.system});
    messages.push_back({"user", args.prompt});
    absl::StatusOr<std::string> rendered = m.chat.Render(messages, true);
    if (!rendered.ok()) return Fail(rendered.status());
    text = *std::move(rendered);
    const int id = m.tokenizer->TokenToId(m.chat.end_of_turn());
    if (!m.chat.end_of_turn().empty() && id >= 0) stop.push_back(id);
  } else if (!args.system.empty()) {
    return Fail(absl::InvalidArgumentError("--system needs --chat"));
  }
  auto encoded = m.tokenizer->Encode(text);
  if (!encoded.ok()) return Fail(encoded.status());
  std::vector<int> prompt_ids = *std::move(encoded);
  // Without a chat format, bos is added as the tokenizer config says; the
  // chat formats write theirs themselves.
  if (!args.chat && m.tokenizer->bos_id() >= 0) {
    prompt_ids.insert(prompt_ids.begin(), m.tokenizer->bos_id());
  }
  if (prompt_ids.empty()) {
    return Fail(absl::InvalidArgumentError("--prompt: encodes to no tokens"));
  }
  // The default length is lowered to fit the model's context; a length
  // asked for explicitly that does not fit is an error (from Generate).
  int max_new = args.max_new_tokens;
  const int room =
      m.policy->config().max_seq_len - static_cast<int>(prompt_ids.size());
  if (!args.max_new_tokens_set && max_new > room && room >= 1) {
    std::fprintf(stderr,
                 "fusionrl: --max-new-tokens lowered from %d to %d to fit the "
                 "model's %d-token context\n",
                 max_new, room, m.policy->config().max_seq_len);
    max_new = room;
  }
  RolloutEngine engine(*m.policy, m.tokenizer->pad_id(), stop);
  SamplingParams sampling;
  sampling.temperature = args.temperature;
  sampling.top_k = args.top_k;
  sampling.top_p = args.top_p;
  sampling.max_new_tokens = max_new;
  auto completions = engine.Generate({prompt_ids}, sampling, args.seed);
  if (!completions.ok()) return Fail(completions.status());
  const Completion& c = (*completions)[0];
  std::vector<int> body;
  for (int t : c.tokens) {
    if (std::find(stop.begin(), stop.end(), t) != stop.end()) break;
    body.push_back(t);
  }
  const std::string out = m.tokenizer->Decode(body);
  if (args.json) {
    nlohmann::json j = {{"prompt_ids", prompt_ids},
                        {"ids", c.tokens},
                        {"text", out},
                        {"finished", c.finished}};
    std::cout << j.dump(-1, ' ', false,
                        nlohmann::json::error_handler_t::replace)
              << "\n";
  } else {
    std::cout << out << "\n";
  }
  return kExitOk;
}

int RunExport(const ExportArgs& args) {
  ModelDirOptions options;
  options.tokenizer = args.tokenizer;
  options.keep_lora_unmerged = !args.merge;
  auto loaded = LoadModelDir(args.source, options);
  if (!loaded.ok()) return Fail(loaded.status());
  if (args.merge && !loaded->policy->lora()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--merge: '", args.source, "' is not a LoRA checkpoint")));
  }
  if (loaded->policy->lora() && !args.merge) {
    // A LoRA checkpoint: its adapters, as PEFT writes them.
    if (auto s =
            ExportPeftAdapter(*loaded->policy, args.out, loaded->lora_base);
        !s.ok()) {
      return Fail(s);
    }
    std::cout << args.out << "\n";
    return kExitOk;
  }
  HfExportOptions export_options;
  export_options.dtype = args.dtype;
  export_options.max_shard_bytes =
      static_cast<uint64_t>(args.max_shard_mb * 1e6);
  export_options.tokenizer_dir = loaded->tokenizer_dir;
  export_options.source_dir = loaded->hf_path;
  export_options.bos_token_id = loaded->bos_token_id;
  export_options.eos_token_ids = loaded->eos_token_ids;
  export_options.max_position_embeddings = loaded->max_position_embeddings;
  if (auto s = ExportHfModel(*loaded->policy, args.out, export_options);
      !s.ok()) {
    return Fail(s);
  }
  std::cout << args.out << "\n";
  return kExitOk;
}

}  // namespace fusionrl::cli
