// Tokenizers map text to token ids and back.
//
// Two implementations sit behind one interface; the engine only ever talks
// to `Tokenizer`, and which one a job uses is chosen from its config
// (model.hf_path / model.tokenizer), never hard-wired:
//   - the character tokenizer of the built-in tiny models: three special
//     tokens (<pad>=0, <bos>=1, <eos>=2) followed by the printable ASCII
//     characters ' '..'~' (vocab_size() == 98);
//   - byte-level BPE loaded from a Hugging Face `tokenizer.json` (+
//     `tokenizer_config.json`), as Qwen2/Qwen3 and Llama-3 ship it
//     (src/tokenizer/bpe_tokenizer.h), with ids equal to the reference
//     implementation's.
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

  // One past the largest id the tokenizer can produce (the model's
  // embedding may be larger: Qwen pads its vocabulary to 151,936).
  virtual int vocab_size() const = 0;
  // Id used to fill padding slots (never attended to). A tokenizer without
  // a pad token reports its eos.
  virtual int pad_id() const = 0;
  // Id prepended to every prompt, or -1 when the model has none (Qwen). With
  // a chat format the format itself writes the begin-of-text token.
  virtual int bos_id() const = 0;
  // The end-of-sequence id the tokenizer config names (the one appended to
  // supervised targets). Generation stops at any of the model's eos ids
  // (generation_config.json may list several), which include this one.
  virtual int eos_id() const = 0;

  // Text -> ids, without adding special tokens; special and added tokens
  // written in the text (e.g. "<|im_start|>") are matched as themselves, as
  // the reference implementation does with add_special_tokens=false.
  // InvalidArgument names the first character the vocabulary cannot
  // represent (or the first invalid UTF-8 byte) and its offset.
  virtual absl::StatusOr<std::vector<int>> Encode(
      std::string_view text) const = 0;

  // Ids -> text. Special tokens are skipped; ids outside the vocabulary are
  // rendered as U+FFFD so that decoding never fails.
  virtual std::string Decode(const std::vector<int>& ids) const = 0;

  // Ids -> text with special tokens written out (the reference's
  // skip_special_tokens=false): DecodeWithSpecial(Encode(s)) == s for any
  // valid UTF-8 s of a byte-level tokenizer that the normalizer leaves
  // unchanged (with Qwen's NFC normalizer: any s in NFC; otherwise NFC(s)).
  // Bytes that do not form valid UTF-8 (a cut-off multi-byte character)
  // decode to U+FFFD, as in the reference.
  virtual std::string DecodeWithSpecial(const std::vector<int>& ids) const {
    return Decode(ids);
  }

  // The id of an exact token string (vocabulary or added token), or -1.
  virtual int TokenToId(std::string_view token) const { return -1; }
};

// The character tokenizer described above (vocab_size() == 98).
std::unique_ptr<Tokenizer> MakeCharTokenizer();

// A byte-level BPE tokenizer from a model or tokenizer directory holding
// `tokenizer.json` and, optionally, `tokenizer_config.json` (which names the
// bos/eos/pad tokens). Errors name the file and what is wrong with it:
// NotFound for a missing tokenizer.json, InvalidArgument for a model type,
// pre-tokenizer, normalizer or decoder this implementation does not support
// (by name), or malformed JSON.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(
    const std::string& dir);

}  // namespace fusionrl

#endif  // FUSIONRL_TOKENIZER_H_
