#include "fusionrl/tokenizer.h"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace fusionrl {
namespace {

constexpr int kPadId = 0;
constexpr int kBosId = 1;
constexpr int kEosId = 2;
constexpr int kFirstCharId = 3;  // id of ' '
constexpr unsigned char kFirstChar = ' ';
constexpr unsigned char kLastChar = '~';
constexpr int kVocabSize = kFirstCharId + (kLastChar - kFirstChar + 1);  // 98
constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Special tokens <pad>, <bos>, <eos>, then printable ASCII ' '..'~'.
// Stateless; thread-safe.
class CharTokenizer final : public Tokenizer {
 public:
  int vocab_size() const override { return kVocabSize; }
  int pad_id() const override { return kPadId; }
  int bos_id() const override { return kBosId; }
  int eos_id() const override { return kEosId; }

  absl::StatusOr<std::vector<int>> Encode(
      std::string_view text) const override {
    std::vector<int> ids;
    ids.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      if (c < kFirstChar || c > kLastChar) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot encode character '",
                         absl::CHexEscape(absl::string_view(&text[i], 1)),
                         "' at offset ", i));
      }
      ids.push_back(kFirstCharId + (c - kFirstChar));
    }
    return ids;
  }

  std::string Decode(const std::vector<int>& ids) const override {
    std::string text;
    text.reserve(ids.size());
    for (int id : ids) {
      if (id == kPadId || id == kBosId || id == kEosId) continue;
      if (id >= kFirstCharId && id < kVocabSize) {
        text.push_back(static_cast<char>(kFirstChar + (id - kFirstCharId)));
      } else {
        text.append(kReplacementChar);
      }
    }
    return text;
  }
};

}  // namespace

std::unique_ptr<Tokenizer> MakeCharTokenizer() {
  return std::make_unique<CharTokenizer>();
}

}  // namespace fusionrl
