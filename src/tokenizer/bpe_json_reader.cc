// Streaming reader of tokenizer.json (see bpe_json_reader.h).
#include "tokenizer/bpe_json_reader.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fusionrl::bpe {
namespace {

using nlohmann::json;

// Builds `doc` from SAX events, except that the entries of model.vocab and
// model.merges are diverted into `out`.
class Reader final : public nlohmann::json_sax<json> {
 public:
  explicit Reader(TokenizerJson* out) : out_(out) {}

  const std::string& error() const { return error_; }

  bool null() override { return Scalar(json(nullptr)); }
  bool boolean(bool v) override { return Scalar(json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::kVocab) return VocabEntry(v);
    return Scalar(json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::kVocab) {
      return VocabEntry(v > (uint64_t{1} << 40) ? -1 : static_cast<int64_t>(v));
    }
    return Scalar(json(v));
  }
  bool number_float(number_float_t v, const string_t&) override {
    return Scalar(json(v));
  }
  bool binary(binary_t& v) override { return Scalar(json(v)); }

  bool string(string_t& v) override {
    switch (mode_) {
      case Mode::kDom:
        return Put(json(std::move(v)));
      case Mode::kVocab:
        return VocabEntry(-1);
      case Mode::kMerges: {
        const size_t space = v.find(' ');
        if (space == std::string::npos ||
            v.find(' ', space + 1) != std::string::npos) {
          return Fail(absl::StrCat("model.merges[", out_->merges.size(),
                                   "]: expected \"a b\", got '", v, "'"));
        }
        out_->merges.emplace_back(v.substr(0, space), v.substr(space + 1));
        return true;
      }
      case Mode::kMergePair:
        pair_.push_back(std::move(v));
        return true;
    }
    return true;
  }

  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }

  bool start_object(std::size_t) override {
    if (mode_ == Mode::kDom) {
      if (AtModelKey("vocab")) {
        mode_ = Mode::kVocab;
        out_->has_vocab = true;
        return true;
      }
      return Open(json::object());
    }
    return BadEntry("an object");
  }

  bool end_object() override {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    return Close();
  }

  bool start_array(std::size_t) override {
    switch (mode_) {
      case Mode::kDom:
        if (AtModelKey("merges")) {
          mode_ = Mode::kMerges;
          out_->has_merges = true;
          return true;
        }
        return Open(json::array());
      case Mode::kMerges:
        mode_ = Mode::kMergePair;
        pair_.clear();
        return true;
      default:
        return BadEntry("an array");
    }
  }

  bool end_array() override {
    switch (mode_) {
      case Mode::kMerges:
        mode_ = Mode::kDom;
        return true;
      case Mode::kMergePair:
        if (pair_.size() != 2) {
          return Fail(absl::StrCat("model.merges[", out_->merges.size(),
                                   "]: expected [a, b], got ", pair_.size(),
                                   " strings"));
        }
        out_->merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
        mode_ = Mode::kMerges;
        return true;
      default:
        return Close();
    }
  }

  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& e) override {
    error_ = absl::StrCat("malformed JSON: ", e.what());
    return false;
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  // Whether the container about to open is the value of `name` in the
  // top-level "model" object.
  bool AtModelKey(std::string_view name) const {
    return stack_.size() == 2 && keys_[1] == "model" &&
           stack_[1]->is_object() && stack_[0]->is_object() && key_ == name;
  }

  bool Scalar(json value) {
    if (mode_ != Mode::kDom) return BadEntry(value.dump());
    return Put(std::move(value));
  }

  bool VocabEntry(int64_t id) {
    if (id < 0 || id >= (int64_t{1} << 30)) {
      return Fail(absl::StrCat("model.vocab['", key_,
                               "']: expected a non-negative id"));
    }
    out_->vocab.emplace_back(std::move(key_), static_cast<int>(id));
    return true;
  }

  bool BadEntry(const std::string& what) {
    if (mode_ == Mode::kVocab) {
      return Fail(absl::StrCat("model.vocab['", key_,
                               "']: expected an id, got ", what));
    }
    return Fail(absl::StrCat("model.merges[", out_->merges.size(),
                             "]: expected \"a b\" or [a, b], got ", what));
  }

  bool Fail(std::string message) {
    error_ = std::move(message);
    return false;
  }

  // Adds a value to the innermost open container (or makes it the root) and
  // returns where it now lives.
  json* Insert(json value) {
    if (stack_.empty()) {
      out_->doc = std::move(value);
      return &out_->doc;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    json& slot = parent[key_];
    slot = std::move(value);
    return &slot;
  }

  bool Put(json value) {
    Insert(std::move(value));
    return true;
  }

  bool Open(json container) {
    const bool in_object = !stack_.empty() && stack_.back()->is_object();
    std::string key = in_object ? key_ : std::string();
    stack_.push_back(Insert(std::move(container)));
    keys_.push_back(std::move(key));
    return true;
  }

  bool Close() {
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }

  TokenizerJson* out_;
  Mode mode_ = Mode::kDom;
  std::vector<json*> stack_;       // open containers, outermost first
  std::vector<std::string> keys_;  // the key each one lives under
  std::string key_;                // the last key read
  std::vector<std::string> pair_;  // the [a, b] merge being read
  std::string error_;
};

}  // namespace

absl::StatusOr<TokenizerJson> ReadTokenizerJson(std::string_view text,
                                                const std::string& file) {
  TokenizerJson out;
  Reader reader(&out);
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &reader);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": malformed JSON: ", e.what()));
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": ",
        reader.error().empty() ? "malformed JSON" : reader.error()));
  }
  return out;
}

}  // namespace fusionrl::bpe
