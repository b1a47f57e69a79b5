// Commands that take a model directory rather than a job:
//   fusionrl generate --model DIR --prompt TEXT [--max-new-tokens N]
//       [--temperature T] [--top-k K] [--top-p P] [--seed S] [--chat]
//       [--system TEXT] [--json] [--device D] [--dtype float32|bfloat16]
//       [--lora PEFT_DIR]
//   fusionrl export <checkpoint or HF dir> --out DIR [--dtype D]
//       [--tokenizer DIR] [--max-shard-mb N] [--merge]
// A LoRA checkpoint exports as a PEFT adapter directory, or with --merge as
// the merged Hugging Face model.
// DIR is a Hugging Face model directory or a FusionRL checkpoint.
#ifndef FUSIONRL_CLI_MODEL_CLI_H_
#define FUSIONRL_CLI_MODEL_CLI_H_

#include <cstdint>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace fusionrl::cli {

struct GenerateArgs {
  std::string model;
  std::string prompt;
  int max_new_tokens = 64;
  bool max_new_tokens_set = false;  // given on the command line
  double temperature = 0.0;         // 0 = greedy
  int top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  bool chat = false;   // apply the model's chat format
  std::string system;  // with --chat: a system message
  bool json = false;   // one JSON line instead of the text
  std::string device = "cpu";
  std::string dtype = "float32";
  std::string tokenizer;  // override the model's tokenizer directory
  int threads = 0;        // LibTorch threads; 0 = leave the default
  std::string lora;       // a PEFT adapter directory to apply
};

struct ExportArgs {
  std::string source;
  std::string out;
  std::string dtype = "float32";
  std::string tokenizer;
  double max_shard_mb = 5000;
  bool merge = false;  // a LoRA checkpoint: the merged model, not the adapter
};

struct ModelCommands {
  CLI::App* generate = nullptr;
  CLI::App* export_ = nullptr;
};

ModelCommands AddModelCommands(CLI::App& app, GenerateArgs& generate,
                               ExportArgs& export_args);

// Return the exit code.
int RunGenerate(const GenerateArgs& args);
int RunExport(const ExportArgs& args);

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_MODEL_CLI_H_
