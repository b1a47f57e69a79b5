// The links of README.md and docs/: every relative link names a file that
// exists and, after a '#', a heading of that file (GitHub's anchors:
// lower case, punctuation dropped, spaces as '-', "-1", "-2" for repeats).
// A page renamed, a heading reworded or a file moved without its links
// fails here, naming the page, the link and what is missing. Links inside
// fenced code blocks and links with a scheme (https:, mailto:) are not
// checked. FUSIONRL_SOURCE_DIR in the environment overrides the checkout.
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

namespace fs = std::filesystem;

fs::path SourceRoot() {
  const char* root = std::getenv("FUSIONRL_SOURCE_DIR");
  return root != nullptr ? root : FUSIONRL_SOURCE_DIR;
}

// The lines of `path` outside fenced code blocks ("```").
std::vector<std::string> ProseLines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string line;
  bool in_code = false;
  while (std::getline(in, line)) {
    if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), "```")) {
      in_code = !in_code;
      lines.emplace_back();
      continue;
    }
    lines.push_back(in_code ? "" : line);
  }
  return lines;
}

// GitHub's anchor of a heading's text.
std::string Anchor(absl::string_view heading) {
  std::string anchor;
  for (char c : heading) {
    unsigned char u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '-' || c == '_' || u >= 0x80) {
      anchor += static_cast<char>(std::tolower(u));
    } else if (c == ' ') {
      anchor += '-';
    }
  }
  return anchor;
}

std::set<std::string> Anchors(const fs::path& page) {
  std::set<std::string> anchors;
  std::map<std::string, int> seen;
  for (const std::string& line : ProseLines(page)) {
    absl::string_view text = line;
    if (!absl::ConsumePrefix(&text, "#")) continue;
    while (absl::ConsumePrefix(&text, "#")) {
    }
    if (!absl::ConsumePrefix(&text, " ")) continue;
    std::string anchor = Anchor(absl::StripAsciiWhitespace(text));
    int n = seen[anchor]++;
    anchors.insert(n == 0 ? anchor : absl::StrCat(anchor, "-", n));
  }
  return anchors;
}

// The targets of the "[text](target)" links on `line`.
std::vector<std::string> LinkTargets(absl::string_view line) {
  std::vector<std::string> targets;
  for (size_t at = line.find("]("); at != absl::string_view::npos;
       at = line.find("](", at + 2)) {
    size_t end = line.find(')', at + 2);
    if (end == absl::string_view::npos) break;
    targets.emplace_back(line.substr(at + 2, end - at - 2));
  }
  return targets;
}

bool HasScheme(absl::string_view target) {
  size_t colon = target.find(':');
  if (colon == absl::string_view::npos) return false;
  for (char c : target.substr(0, colon)) {
    if (!std::isalpha(static_cast<unsigned char>(c))) return false;
  }
  return colon > 0;
}

// Every broken link of `page`, one line each.
std::vector<std::string> BrokenLinks(const fs::path& root,
                                     const fs::path& page) {
  std::vector<std::string> broken;
  std::vector<std::string> lines = ProseLines(page);
  std::string name = page.lexically_relative(root).generic_string();
  for (size_t i = 0; i < lines.size(); ++i) {
    for (const std::string& target : LinkTargets(lines[i])) {
      if (target.empty() || HasScheme(target) ||
          absl::StrContains(target, " ")) {
        continue;
      }
      std::string file = target.substr(0, target.find('#'));
      std::string anchor =
          file.size() < target.size() ? target.substr(file.size() + 1) : "";
      fs::path linked =
          file.empty() ? page : (page.parent_path() / file).lexically_normal();
      std::string where = absl::StrCat(name, ":", i + 1, ": (", target, ")");
      if (!fs::exists(linked)) {
        broken.push_back(absl::StrCat(where, ": no such file"));
      } else if (!anchor.empty() && linked.extension() == ".md" &&
                 Anchors(linked).count(anchor) == 0) {
        broken.push_back(absl::StrCat(where, ": no heading #", anchor));
      }
    }
  }
  return broken;
}

TEST(DocsLinksTest, EveryRelativeLinkOfTheReadmeAndDocsResolves) {
  fs::path root = SourceRoot();
  std::vector<fs::path> pages = {root / "README.md"};
  for (const fs::directory_entry& entry :
       fs::recursive_directory_iterator(root / "docs")) {
    if (entry.path().extension() == ".md") pages.push_back(entry.path());
  }
  ASSERT_GT(pages.size(), 10u) << "no docs under " << root;
  std::vector<std::string> broken;
  for (const fs::path& page : pages) {
    for (std::string& b : BrokenLinks(root, page)) broken.push_back(b);
  }
  EXPECT_THAT(broken, testing::IsEmpty())
      << "broken links:\n  " << absl::StrJoin(broken, "\n  ");
}

TEST(DocsLinksTest, AnchorsFollowGitHub) {
  EXPECT_EQ(Anchor("The README's two commands"), "the-readmes-two-commands");
  EXPECT_EQ(Anchor("`fusionrl status`"), "fusionrl-status");
  EXPECT_EQ(Anchor("LoRA (`model.lora`, `model.lora_path`)"),
            "lora-modellora-modellora_path");
  EXPECT_EQ(Anchor("Multi-turn tool use: agent-calc (2026-12-06, afternoon)"),
            "multi-turn-tool-use-agent-calc-2026-12-06-afternoon");
}

// A link to a missing page and one to a missing heading are both caught.
TEST(DocsLinksTest, CatchesAMissingPageAndAMissingHeading) {
  fs::path dir = fs::path(testing::TempDir()) / "docs_links_test";
  fs::create_directories(dir);
  {
    std::ofstream(dir / "a.md") << "# Title\n\n## Two words\n\n"
                                << "[ok](#two-words) [ok](a.md#title)\n"
                                << "[gone](b.md) [no](a.md#three-words)\n"
                                << "```\n[code](c.md)\n```\n"
                                << "[web](https://example.com/x.md)\n";
  }
  EXPECT_THAT(BrokenLinks(dir, dir / "a.md"),
              testing::ElementsAre(
                  "a.md:6: (b.md): no such file",
                  "a.md:6: (a.md#three-words): no heading #three-words"));
}

}  // namespace
}  // namespace fusionrl
