// `fusionrl tokenize --tokenizer DIR [--decode | --bench]`: the tokenizer of
// a Hugging Face model directory as a filter, for scripts and for checking
// ids against other implementations.
//   encode (default): stdin has one JSON string per line; stdout gets one
//                     JSON array of ids per line (no special tokens added;
//                     special tokens written in the text are matched).
//   --decode:         stdin has one JSON array of ids per line; stdout gets
//                     one JSON string per line (special tokens written out).
//   --bench:          stdin is a corpus as in encode mode; it is repeated to
//                     --bench-mb MB and encoded --repeats times; stdout gets
//                     one JSON object with load time and MB/s figures.
// A bad input line stops the command with an error naming the line number
// (exit 2); a tokenizer that does not load exits 2 as well.
#ifndef FUSIONRL_CLI_TOKENIZE_CLI_H_
#define FUSIONRL_CLI_TOKENIZE_CLI_H_

#include <iosfwd>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace fusionrl::cli {

struct TokenizeArgs {
  std::string tokenizer_dir;  // holds tokenizer.json (+ tokenizer_config.json)
  bool decode = false;
  bool bench = false;
  double bench_mb = 5.0;  // --bench: corpus repeated to at least this size
  int repeats = 3;        // --bench: timed passes (the median is reported)
};

CLI::App* AddTokenizeCommand(CLI::App& app, TokenizeArgs& args);

// Runs the command on `in` / `out`, errors to stderr; returns the exit code.
int RunTokenize(const TokenizeArgs& args, std::istream& in, std::ostream& out);

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_TOKENIZE_CLI_H_
