// Byte-level BPE: unit tests on a small hand-written tokenizer.json, and the
// golden test against Qwen3's real tokenizer (ids from the reference
// implementation, tests/data/tokenizer/make_golden.js), skipped when the
// tokenizer files have not been fetched (scripts/fetch-test-data.sh).
#include "tokenizer/bpe_tokenizer.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fusionrl/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tokenizer/bpe_text.h"

namespace fusionrl {
namespace {

using nlohmann::json;

constexpr const char* kQwenPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// The byte-level character string of raw bytes.
std::string Mapped(std::string_view bytes) {
  std::string out;
  for (char c : bytes) out += bpe::ByteToUnicode(static_cast<unsigned char>(c));
  return out;
}

// A small Qwen-shaped tokenizer.json: the 256 byte tokens (id == byte), then
// one token per merge (ids 256, 257, ...), then added tokens from 300.
json SmallTokenizer(
    const std::vector<std::pair<std::string, std::string>>& merges = {
        {"h", "e"},
        {"l", "l"},
        {"he", "ll"},
        {"hell", "o"},
        {" ", "w"},
        {"o", "r"},
        {" w", "or"},
        {" wor", "ld"},
        {"l", "d"}}) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[bpe::ByteToUnicode(static_cast<unsigned char>(b))] = b;
  }
  json merge_list = json::array();
  int next_id = 256;
  for (const auto& [a, b] : merges) {
    merge_list.push_back(Mapped(a) + " " + Mapped(b));
    if (!vocab.contains(Mapped(a + b))) vocab[Mapped(a + b)] = next_id++;
  }
  json added = json::array();
  added.push_back({{"id", 300},
                   {"content", "<|end|>"},
                   {"special", true},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"normalized", false},
                   {"single_word", false}});
  added.push_back({{"id", 301},
                   {"content", "<|e"},
                   {"special", true},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"normalized", false},
                   {"single_word", false}});
  added.push_back({{"id", 302},
                   {"content", "<think>"},
                   {"special", false},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"normalized", false},
                   {"single_word", false}});
  return {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", kQwenPattern}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", false},
           {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"byte_fallback", false},
        {"vocab", vocab},
        {"merges", merge_list}}},
  };
}

std::unique_ptr<BpeTokenizer> Make(const json& tokenizer,
                                   const json& config = json()) {
  auto tok = BpeTokenizer::FromJson(tokenizer.dump(),
                                    config.is_null() ? "" : config.dump());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

std::vector<int> MustEncode(const Tokenizer& tok, std::string_view text) {
  auto ids = tok.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int>{};
}

std::string LoadError(const json& tokenizer) {
  auto tok = BpeTokenizer::FromJson(tokenizer.dump(), "");
  return tok.ok() ? "(loaded)" : std::string(tok.status().message());
}

TEST(BpeTokenizerTest, MergesByRank) {
  const auto tok = Make(SmallTokenizer());
  ASSERT_NE(tok, nullptr);
  // hello = 259, " world" = 263 (" w" 260, "or" 261, " wor" 262).
  EXPECT_EQ(MustEncode(*tok, "hello world"), (std::vector<int>{259, 263}));
  // In "lld", l+l (rank 1) beats l+d (rank 8), leaving "ll" + "d".
  EXPECT_EQ(MustEncode(*tok, "lld"), (std::vector<int>{257, 'd'}));
  // Reversed ranks give the other split.
  const auto reversed = Make(SmallTokenizer({{"l", "d"}, {"l", "l"}}));
  ASSERT_NE(reversed, nullptr);
  EXPECT_EQ(MustEncode(*reversed, "lld"), (std::vector<int>{'l', 256}));
}

TEST(BpeTokenizerTest, AcceptsMergesAsPairs) {
  json tokenizer = SmallTokenizer();
  json pairs = json::array();
  for (const auto& line : tokenizer["model"]["merges"]) {
    const std::string s = line.get<std::string>();
    const size_t space = s.find(' ');
    pairs.push_back({s.substr(0, space), s.substr(space + 1)});
  }
  tokenizer["model"]["merges"] = pairs;
  const auto tok = Make(tokenizer);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(MustEncode(*tok, "hello world"), (std::vector<int>{259, 263}));
}

TEST(BpeTokenizerTest, LongWordsMergeLikeShortOnes) {
  // 101 'a's exceed the heap threshold: 25 x "aaaa" then "a".
  const auto tok = Make(SmallTokenizer({{"a", "a"}, {"aa", "aa"}}));
  ASSERT_NE(tok, nullptr);
  std::vector<int> expected(25, 257);
  expected.push_back('a');
  EXPECT_EQ(MustEncode(*tok, std::string(101, 'a')), expected);
  EXPECT_EQ(MustEncode(*tok, std::string(9, 'a')),
            (std::vector<int>{257, 257, 'a'}));
}

TEST(BpeTokenizerTest, MatchesAddedTokensLongestFirstAndSkipsSpecials) {
  const auto tok = Make(SmallTokenizer());
  ASSERT_NE(tok, nullptr);
  const std::string text = "hello<|end|><|e<think>hello<|en";
  const std::vector<int> ids = MustEncode(*tok, text);
  EXPECT_EQ(ids, (std::vector<int>{259, 300, 301, 302, 259, 301, 'n'}));
  EXPECT_EQ(tok->DecodeWithSpecial(ids), text);
  // Special tokens go; the non-special added token stays.
  EXPECT_EQ(tok->Decode(ids), "hello<think>hellon");
  EXPECT_EQ(tok->TokenToId("<|end|>"), 300);
  EXPECT_EQ(tok->TokenToId(Mapped(" w")), 260);
  EXPECT_EQ(tok->TokenToId("nope"), -1);
  EXPECT_EQ(tok->vocab_size(), 303);
}

TEST(BpeTokenizerTest, EncodesAnyBytesWithoutFallback) {
  const auto tok = Make(SmallTokenizer());
  ASSERT_NE(tok, nullptr);
  const std::string emoji = "\xF0\x9F\x98\x80";  // U+1F600
  EXPECT_EQ(MustEncode(*tok, emoji),
            (std::vector<int>{0xF0, 0x9F, 0x98, 0x80}));
  const std::string mixed = "Zoë 👩🏽‍💻 — 東京\r\n\t x";
  EXPECT_EQ(tok->DecodeWithSpecial(MustEncode(*tok, mixed)), mixed);
}

TEST(BpeTokenizerTest, NormalizesToNfc) {
  const auto tok = Make(SmallTokenizer());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(MustEncode(*tok, "e\xCC\x81"), MustEncode(*tok, "\xC3\xA9"));
  EXPECT_EQ(MustEncode(*tok, "\xC3\xA9"), (std::vector<int>{0xC3, 0xA9}));
}

// Ids outside the tokenizer are dropped, as Hugging Face's decode drops
// them; bytes that do not form UTF-8 become U+FFFD, as its byte-level
// decoder makes them.
TEST(BpeTokenizerTest, DropsUnknownIdsAndDecodesBrokenBytesAsReplacement) {
  const auto tok = Make(SmallTokenizer());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Decode({'h', -1, 100000, 'i'}), "hi");
  EXPECT_EQ(tok->DecodeWithSpecial({'h', 100000, 'i'}), "hi");
  // Half of a two-byte character.
  EXPECT_EQ(tok->Decode({'a', 0xC3}), "a\xEF\xBF\xBD");
}

TEST(BpeTokenizerTest, RefusesInvalidUtf8WithItsOffset) {
  const auto tok = Make(SmallTokenizer());
  ASSERT_NE(tok, nullptr);
  auto ids = tok->Encode("abc\xC3(");
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ids.status().message().find("byte offset 3"), std::string::npos)
      << ids.status();
  EXPECT_FALSE(tok->Encode("\xED\xA0\x80").ok());  // a surrogate
  EXPECT_FALSE(tok->Encode("\xC0\xAF").ok());      // overlong '/'
}

TEST(BpeTokenizerTest, HonoursIgnoreMerges) {
  // "hello" is in the vocabulary; without merges it is five bytes.
  json tokenizer = SmallTokenizer();
  tokenizer["model"]["vocab"][Mapped("xyz")] = 299;
  const auto plain = Make(tokenizer);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(MustEncode(*plain, "xyz"), (std::vector<int>{'x', 'y', 'z'}));
  tokenizer["model"]["ignore_merges"] = true;
  const auto ignoring = Make(tokenizer);
  ASSERT_NE(ignoring, nullptr);
  EXPECT_EQ(MustEncode(*ignoring, "xyz"), (std::vector<int>{299}));
}

TEST(BpeTokenizerTest, Gpt2ByteLevelRegex) {
  json tokenizer = SmallTokenizer();
  tokenizer["pre_tokenizer"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  tokenizer["normalizer"] = nullptr;
  const auto tok = Make(tokenizer);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(MustEncode(*tok, "hello world"), (std::vector<int>{259, 263}));
}

TEST(BpeTokenizerTest, ReadsSpecialIdsFromTheConfig) {
  json tokenizer = SmallTokenizer();
  const auto qwen_like = Make(tokenizer, {{"bos_token", nullptr},
                                          {"eos_token", "<|end|>"},
                                          {"pad_token", {{"content", "<|e"}}}});
  ASSERT_NE(qwen_like, nullptr);
  EXPECT_EQ(qwen_like->bos_id(), -1);
  EXPECT_EQ(qwen_like->eos_id(), 300);
  EXPECT_EQ(qwen_like->pad_id(), 301);
  const auto llama_like =
      Make(tokenizer, {{"bos_token", "<think>"}, {"eos_token", "<|end|>"}});
  ASSERT_NE(llama_like, nullptr);
  EXPECT_EQ(llama_like->bos_id(), 302);
  EXPECT_EQ(llama_like->pad_id(), 300);  // falls back to eos
  const auto no_bos = Make(tokenizer, {{"bos_token", "<think>"},
                                       {"add_bos_token", false},
                                       {"eos_token", "<|end|>"}});
  ASSERT_NE(no_bos, nullptr);
  EXPECT_EQ(no_bos->bos_id(), -1);
  auto unknown =
      BpeTokenizer::FromJson(tokenizer.dump(), R"({"eos_token": "</s>"})");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find(
                "tokenizer_config.json: eos_token: '</s>'"),
            std::string::npos)
      << unknown.status();
}

TEST(BpeTokenizerTest, RefusesUnsupportedComponentsByName) {
  json t = SmallTokenizer();
  t["model"]["type"] = "WordPiece";
  EXPECT_EQ(LoadError(t),
            "tokenizer.json: model.type: 'WordPiece' is not supported "
            "(byte-level BPE only)");
  t = SmallTokenizer();
  t["model"]["byte_fallback"] = true;
  EXPECT_NE(LoadError(t).find("model.byte_fallback: true"), std::string::npos);
  t = SmallTokenizer();
  t["normalizer"] = {{"type", "NFKC"}};
  EXPECT_NE(LoadError(t).find("normalizer.type: 'NFKC' is not supported"),
            std::string::npos);
  t = SmallTokenizer();
  t["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
  EXPECT_NE(LoadError(t).find("normalizer.normalizers[1].type: 'Lowercase'"),
            std::string::npos);
  t = SmallTokenizer();
  t["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_NE(LoadError(t).find("pre_tokenizer.type: 'Metaspace' is not "
                              "supported"),
            std::string::npos);
  t = SmallTokenizer();
  t["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  EXPECT_NE(
      LoadError(t).find("pre_tokenizer.pretokenizers[0].behavior: 'Removed'"),
      std::string::npos);
  t = SmallTokenizer();
  t["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true;
  EXPECT_NE(LoadError(t).find("add_prefix_space: true is not supported"),
            std::string::npos);
  t = SmallTokenizer();
  t["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(LoadError(t).find("decoder.type: 'WordPiece' is not supported"),
            std::string::npos);
  t = SmallTokenizer();
  t["added_tokens"][0]["lstrip"] = true;
  EXPECT_NE(LoadError(t).find("added_tokens[0] ('<|end|>').lstrip: true"),
            std::string::npos);
  t = SmallTokenizer();
  t["model"]["merges"].push_back("q z");
  EXPECT_NE(LoadError(t).find("token 'qz' is not in model.vocab"),
            std::string::npos);
  t = SmallTokenizer();
  t["model"]["vocab"]["zz"] = "x";
  EXPECT_NE(LoadError(t).find("model.vocab['zz']: expected a non-negative id"),
            std::string::npos)
      << LoadError(t);
  t = SmallTokenizer();
  t["model"]["merges"].push_back({"a", "b", "c"});
  EXPECT_NE(LoadError(t).find("model.merges[9]: expected [a, b]"),
            std::string::npos)
      << LoadError(t);
  t = SmallTokenizer();
  t.erase("decoder");
  EXPECT_NE(LoadError(t).find("decoder: null is not supported"),
            std::string::npos);
  t = SmallTokenizer();
  t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_NE(LoadError(t).find("does not compile"), std::string::npos);
}

TEST(BpeTokenizerTest, ReportsMalformedAndMissingFiles) {
  auto bad = BpeTokenizer::FromJson("{\"model\": ", "");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tokenizer.json: malformed JSON"),
            std::string::npos);

  const std::string dir =
      absl::StrCat(testing::TempDir(), "/bpe_missing_",
                   std::chrono::steady_clock::now().time_since_epoch().count());
  std::filesystem::create_directories(dir);
  auto missing = LoadTokenizer(dir);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("tokenizer.json"),
            std::string::npos);

  std::ofstream(dir + "/tokenizer.json") << SmallTokenizer().dump();
  std::ofstream(dir + "/tokenizer_config.json") << "{not json";
  auto bad_config = LoadTokenizer(dir);
  ASSERT_FALSE(bad_config.ok());
  EXPECT_NE(bad_config.status().message().find(
                "tokenizer_config.json: malformed JSON"),
            std::string::npos);
  std::ofstream(dir + "/tokenizer_config.json") << R"({"eos_token":"<|end|>"})";
  auto good = LoadTokenizer(dir);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ((*good)->eos_id(), 300);
  std::filesystem::remove_all(dir);
}

TEST(BpeTokenizerTest, IsSafeToShareBetweenThreads) {
  const auto tok = Make(SmallTokenizer());
  ASSERT_NE(tok, nullptr);
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) {
    texts.push_back(absl::StrCat("hello world ", i, " lld<|end|> w", i * 7));
  }
  std::vector<std::vector<int>> expected;
  for (const auto& t : texts) expected.push_back(MustEncode(*tok, t));
  const auto fresh = Make(SmallTokenizer());  // empty cache, raced below
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          auto ids = fresh->Encode(texts[(i + w * 31) % texts.size()]);
          if (!ids.ok() || *ids != expected[(i + w * 31) % texts.size()]) {
            ++failures[w];
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

// ---------------------------------------------------------------------------
// Golden tests: real tokenizers against the reference's ids.

std::string TestDataDir() {
  if (const char* env = std::getenv("FUSIONRL_TEST_DATA");
      env != nullptr && *env != '\0') {
    return env;
  }
  const char* home = std::getenv("HOME");
  return absl::StrCat(home ? home : "", "/.cache/fusionrl/test-data");
}

// One model's tokenizer from the test-data directory, loaded once per test.
class GoldenTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(TestDataDir(), "/", GetParam(), "-tokenizer");
    if (!std::filesystem::exists(dir_ + "/tokenizer.json")) {
      GTEST_SKIP() << GetParam() << " tokenizer not found at " << dir_
                   << "; run scripts/fetch-test-data.sh";
    }
    const auto start = std::chrono::steady_clock::now();
    auto tok = BpeTokenizer::Load(dir_);
    load_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
  }

  std::string dir_;
  double load_seconds_ = 0;
  std::unique_ptr<BpeTokenizer> tok_;
};

TEST_P(GoldenTest, HasTheModelsSpecialIds) {
  std::printf("[   INFO   ] %s tokenizer loaded in %.3f s (regex JIT: %s)\n",
              GetParam().c_str(), load_seconds_,
              tok_->regex_jit() ? "yes" : "no");
  if (GetParam() == "qwen3") {
    EXPECT_EQ(tok_->vocab_size(), 151669);
    EXPECT_EQ(tok_->bos_id(), -1);      // bos_token null
    EXPECT_EQ(tok_->eos_id(), 151645);  // <|im_end|>
    EXPECT_EQ(tok_->pad_id(), 151643);  // <|endoftext|>
    EXPECT_EQ(tok_->TokenToId("<|im_start|>"), 151644);
    EXPECT_EQ(tok_->TokenToId("<|im_end|>"), 151645);
    EXPECT_EQ(tok_->TokenToId("<think>"), 151667);
  } else {
    EXPECT_EQ(tok_->vocab_size(), 128256);
    EXPECT_EQ(tok_->bos_id(), 128000);  // <|begin_of_text|>
    EXPECT_EQ(tok_->eos_id(), 128001);  // <|end_of_text|>
    EXPECT_EQ(tok_->pad_id(), 128001);  // no pad token: eos
    EXPECT_EQ(tok_->TokenToId("<|eot_id|>"), 128009);
  }
}

TEST_P(GoldenTest, EncodesTheCorpusExactlyAsTheReference) {
  const std::string golden_path =
      absl::StrCat(FUSIONRL_SOURCE_DIR, "/tests/data/tokenizer/", GetParam(),
                   "_golden.jsonl");
  std::ifstream in(golden_path);
  ASSERT_TRUE(in) << golden_path;
  std::string line;
  int total = 0;
  int mismatches = 0;
  int round_trip_failures = 0;
  int nfc_already = 0;
  size_t bytes = 0;
  double encode_seconds = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const json entry = json::parse(line);
    const std::string text = entry["text"].get<std::string>();
    const std::vector<int> want = entry["ids"].get<std::vector<int>>();
    ++total;
    bytes += text.size();
    const auto start = std::chrono::steady_clock::now();
    auto got = tok_->Encode(text);
    encode_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    ASSERT_TRUE(got.ok()) << got.status() << " for " << json(text).dump();
    if (*got != want) {
      ++mismatches;
      ADD_FAILURE() << "ids differ for " << json(text).dump() << "\n  want "
                    << json(want).dump() << "\n  got  " << json(*got).dump();
    }
    // Qwen3 normalizes to NFC, so decoding gives back NFC(text): the text
    // itself for the 90% of the corpus that is already in NFC. Llama-3 has
    // no normalizer and gives back the text.
    std::string nfc;
    auto changed = bpe::NfcNormalize(text, &nfc);
    ASSERT_TRUE(changed.ok()) << changed.status();
    const std::string& nfc_text = *changed ? nfc : text;
    if (nfc_text == text) ++nfc_already;
    const std::string& expected = GetParam() == "qwen3" ? nfc_text : text;
    const std::string back = tok_->DecodeWithSpecial(*got);
    if (back != expected) {
      ++round_trip_failures;
      ADD_FAILURE() << "round trip differs for " << json(text).dump() << ": "
                    << json(back).dump();
    }
  }
  std::printf(
      "[   INFO   ] %s golden: %d/%d strings exact; %d round-trip failures "
      "(%d strings already NFC); %zu bytes (cold cache: %.1f MB/s)\n",
      GetParam().c_str(), total - mismatches, total, round_trip_failures,
      nfc_already, bytes, bytes / 1e6 / std::max(encode_seconds, 1e-9));
  EXPECT_GE(total, 300);
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(round_trip_failures, 0);
}

INSTANTIATE_TEST_SUITE_P(RealTokenizers, GoldenTest,
                         testing::Values("qwen3", "llama3"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace fusionrl
