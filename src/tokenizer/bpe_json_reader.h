// Reads a Hugging Face tokenizer.json in one streaming (SAX) pass: the two
// large parts, model.vocab (~150k entries) and model.merges (~150k pairs),
// go straight into flat vectors, and only the small rest becomes a JSON
// document. About 3x faster than building the whole document.
//
// Thread safety: a pure function.
#ifndef FUSIONRL_TOKENIZER_BPE_JSON_READER_H_
#define FUSIONRL_TOKENIZER_BPE_JSON_READER_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace fusionrl::bpe {

struct TokenizerJson {
  // The document without model.vocab and model.merges.
  nlohmann::json doc;
  bool has_vocab = false;   // model.vocab was an object
  bool has_merges = false;  // model.merges was an array
  // model.vocab in file order: token string -> id (validated: 0 <= id < 2^30).
  std::vector<std::pair<std::string, int>> vocab;
  // model.merges in rank order, from "a b" strings or [a, b] pairs.
  std::vector<std::pair<std::string, std::string>> merges;
};

// InvalidArgument "<file>: malformed JSON: ..." for a syntax error, or
// "<file>: model.vocab[...] / model.merges[i]: ..." for a bad entry.
absl::StatusOr<TokenizerJson> ReadTokenizerJson(std::string_view text,
                                                const std::string& file);

}  // namespace fusionrl::bpe

#endif  // FUSIONRL_TOKENIZER_BPE_JSON_READER_H_
