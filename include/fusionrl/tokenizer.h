// Tokenizers map text to token ids and back.
//
// FusionRL's built-in tasks use a character tokenizer: three special tokens
// (<pad>=0, <bos>=1, <eos>=2) followed by the printable ASCII characters
// ' '..'~'. The interface is the seam for a BPE tokenizer later: the engine
// only ever talks to `Tokenizer`.
//
// Thread safety: implementations are immutable after construction and safe to
// share between threads.
#ifndef FUSIONRL_TOKENIZER_H_
#define FUSIONRL_TOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fusionrl {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual int vocab_size() const = 0;
  virtual int pad_id() const = 0;
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;

  // Text -> ids, without special tokens. InvalidArgument names the first
  // character the vocabulary cannot represent and its offset.
  virtual absl::StatusOr<std::vector<int>> Encode(
      std::string_view text) const = 0;

  // Ids -> text. Special tokens are skipped; ids outside the vocabulary are
  // rendered as U+FFFD so that decoding never fails.
  virtual std::string Decode(const std::vector<int>& ids) const = 0;
};

// The character tokenizer described above (vocab_size() == 98).
std::unique_ptr<Tokenizer> MakeCharTokenizer();

}  // namespace fusionrl

#endif  // FUSIONRL_TOKENIZER_H_
