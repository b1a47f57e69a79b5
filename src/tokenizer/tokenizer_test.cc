#include "fusionrl/tokenizer.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace fusionrl {
namespace {

std::string AllPrintable() {
  std::string s;
  for (char c = ' '; c <= '~'; ++c) s.push_back(c);
  return s;
}

TEST(CharTokenizerTest, HasTheDocumentedVocabulary) {
  const auto tok = MakeCharTokenizer();
  EXPECT_EQ(tok->vocab_size(), 98);
  EXPECT_EQ(tok->pad_id(), 0);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  const auto ids = tok->Encode(" ~A");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int>{3, 97, 3 + 'A' - ' '}));
}

TEST(CharTokenizerTest, RoundTripsEveryPrintableCharacter) {
  const auto tok = MakeCharTokenizer();
  const std::string text = AllPrintable() + "47+385=432 rev:abc=cba";
  const auto ids = tok->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->size(), text.size());
  for (int id : *ids) {
    EXPECT_GE(id, 3);
    EXPECT_LT(id, tok->vocab_size());
  }
  EXPECT_EQ(tok->Decode(*ids), text);
}

TEST(CharTokenizerTest, EncodesEmptyText) {
  const auto ids = MakeCharTokenizer()->Encode("");
  ASSERT_TRUE(ids.ok());
  EXPECT_TRUE(ids->empty());
}

TEST(CharTokenizerTest, RejectsControlCharacterWithEscapeAndOffset) {
  const auto ids = MakeCharTokenizer()->Encode(
      "abc\x07"
      "def");
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ids.status().message(),
            "cannot encode character '\\x07' at offset 3");
}

TEST(CharTokenizerTest, RejectsNewlineTabAndNonAscii) {
  const auto tok = MakeCharTokenizer();
  EXPECT_EQ(tok->Encode("a\nb").status().message(),
            "cannot encode character '\\n' at offset 1");
  EXPECT_EQ(tok->Encode("\tx").status().message(),
            "cannot encode character '\\t' at offset 0");
  EXPECT_EQ(tok->Encode("ok \xC3\xA9").status().message(),
            "cannot encode character '\\xc3' at offset 3");
  EXPECT_EQ(tok->Encode(std::string("a\0b", 3)).status().message(),
            "cannot encode character '\\x00' at offset 1");
  EXPECT_EQ(tok->Encode("\x7f").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CharTokenizerTest, DecodeSkipsSpecialTokens) {
  const auto tok = MakeCharTokenizer();
  const auto ids = tok->Encode("hi");
  ASSERT_TRUE(ids.ok());
  std::vector<int> with_specials = {tok->bos_id(), (*ids)[0],
                                    tok->pad_id(), (*ids)[1],
                                    tok->eos_id(), tok->pad_id()};
  EXPECT_EQ(tok->Decode(with_specials), "hi");
}

TEST(CharTokenizerTest, DecodeRendersUnknownIdsAsReplacementCharacter) {
  const auto tok = MakeCharTokenizer();
  EXPECT_EQ(tok->Decode({-1, 3 + 'a' - ' ', 98, 1000}),
            "\xEF\xBF\xBD"
            "a"
            "\xEF\xBF\xBD"
            "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace fusionrl
