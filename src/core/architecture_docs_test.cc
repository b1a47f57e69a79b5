// docs/architecture.md against the tree: its table of rooms (the one under
// "| folder |") names exactly the folders under src/ that hold source files
// (.cc or .h), nested ones included, and every source file it names in
// backticks exists. A folder added, moved or emptied, or a file moved,
// without the doc fails here, naming the folder or the file. The tree is read
// when the test runs: FUSIONRL_SOURCE_DIR in the environment overrides the
// checkout the test was built from.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

namespace fs = std::filesystem;

std::string SourceRoot() {
  const char* root = std::getenv("FUSIONRL_SOURCE_DIR");
  return root != nullptr ? root : FUSIONRL_SOURCE_DIR;
}

// "src/engine/model/" for every folder under <root>/src that holds a .cc or
// .h file directly.
std::set<std::string> SourceFolders(const fs::path& root) {
  std::set<std::string> folders;
  for (const fs::directory_entry& entry :
       fs::recursive_directory_iterator(root / "src")) {
    if (!entry.is_regular_file()) continue;
    std::string ext = entry.path().extension().string();
    if (ext != ".cc" && ext != ".h") continue;
    std::string folder =
        entry.path().parent_path().lexically_relative(root).generic_string();
    folders.insert(folder + "/");
  }
  return folders;
}

// The folders in the first cell of the rows of the table under "| folder |",
// as written ("src/core/"), with a problem for each row that names none or
// names one twice.
std::vector<std::string> DocFolders(const std::string& doc,
                                    std::vector<std::string>& problems) {
  std::vector<std::string> folders;
  std::istringstream in(doc);
  std::string line;
  bool in_table = false;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!in_table) {
      in_table = absl::StartsWith(line, "| folder |");
      continue;
    }
    if (!absl::StartsWith(line, "|")) break;
    if (absl::StartsWith(line, "|---") || absl::StartsWith(line, "| ---")) {
      continue;
    }
    std::vector<absl::string_view> cells = absl::StrSplit(line, '|');
    absl::string_view first =
        cells.size() > 1 ? absl::StripAsciiWhitespace(cells[1]) : "";
    if (!absl::ConsumePrefix(&first, "`") ||
        !absl::ConsumeSuffix(&first, "`") || !absl::StartsWith(first, "src/") ||
        !absl::EndsWith(first, "/")) {
      problems.push_back(absl::StrCat("docs/architecture.md:", number,
                                      ": the first cell is not a `src/.../` "
                                      "folder: ",
                                      line));
      continue;
    }
    folders.emplace_back(first);
  }
  if (folders.empty()) {
    problems.push_back("docs/architecture.md: no table under \"| folder |\"");
  }
  return folders;
}

// Every difference between the doc's rooms and `tree`, one line each.
std::vector<std::string> CompareRooms(const std::string& doc,
                                      const std::set<std::string>& tree) {
  std::vector<std::string> problems;
  std::set<std::string> named;
  for (const std::string& folder : DocFolders(doc, problems)) {
    if (!named.insert(folder).second) {
      problems.push_back(
          absl::StrCat("docs/architecture.md names `", folder, "` twice"));
    } else if (tree.count(folder) == 0) {
      problems.push_back(absl::StrCat("docs/architecture.md names `", folder,
                                      "`, which holds no source file"));
    }
  }
  for (const std::string& folder : tree) {
    if (named.count(folder) == 0) {
      problems.push_back(absl::StrCat("`", folder,
                                      "` holds sources but "
                                      "docs/architecture.md does not name it"));
    }
  }
  return problems;
}

std::string ReadArchitectureDoc() {
  fs::path path = fs::path(SourceRoot()) / "docs" / "architecture.md";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ArchitectureDocsTest, NamesExactlyTheFoldersUnderSrc) {
  std::set<std::string> tree = SourceFolders(SourceRoot());
  ASSERT_FALSE(tree.empty()) << "no sources under " << SourceRoot() << "/src";
  std::vector<std::string> problems = CompareRooms(ReadArchitectureDoc(), tree);
  EXPECT_THAT(problems, testing::IsEmpty())
      << "the rooms of docs/architecture.md and the folders under src/ "
         "disagree:\n  "
      << absl::StrJoin(problems, "\n  ");
}

// The source files the doc names in backticks, as written: a path under
// src/ ("`core/clock.h`", "`src/worker/worker.cc`") or a bare file name
// ("`sync_step.cc`").
std::vector<std::string> NamedFiles(const std::string& doc) {
  static const std::set<std::string> kRooms = {
      "cli", "controller", "core",  "engine",   "hf",        "local",
      "rpc", "sim",        "tasks", "template", "tokenizer", "worker"};
  std::vector<std::string> files;
  std::vector<absl::string_view> parts = absl::StrSplit(doc, '`');
  for (size_t i = 1; i < parts.size(); i += 2) {
    absl::string_view word = parts[i];
    absl::ConsumePrefix(&word, "src/");
    if (!absl::EndsWith(word, ".h") && !absl::EndsWith(word, ".cc")) continue;
    if (absl::StrContains(word, " ") || absl::StrContains(word, "*") ||
        absl::StartsWith(word, ".")) {
      continue;
    }
    size_t slash = word.find('/');
    if (slash != absl::string_view::npos &&
        kRooms.count(std::string(word.substr(0, slash))) == 0) {
      continue;  // a public header, a LibTorch header
    }
    files.emplace_back(word);
  }
  return files;
}

TEST(ArchitectureDocsTest, EverySourceFileItNamesExists) {
  fs::path src = fs::path(SourceRoot()) / "src";
  std::set<std::string> names;
  for (const fs::directory_entry& entry :
       fs::recursive_directory_iterator(src)) {
    if (entry.is_regular_file()) names.insert(entry.path().filename());
  }
  std::vector<std::string> missing;
  for (const std::string& file : NamedFiles(ReadArchitectureDoc())) {
    bool bare = file.find('/') == std::string::npos;
    if (bare ? names.count(file) == 0 : !fs::exists(src / file)) {
      missing.push_back(file);
    }
  }
  EXPECT_THAT(missing, testing::IsEmpty())
      << "docs/architecture.md names files that are not under src/:\n  "
      << absl::StrJoin(missing, "\n  ");
}

// The comparison itself: a folder the doc lacks and one it names in vain
// are both caught, by name.
TEST(ArchitectureDocsTest, CatchesAFolderAddedAndAFolderGone) {
  const std::string doc =
      "| folder | what |\n|---|---|\n"
      "| `src/core/` | shared |\n| `src/engine/model/` | the policy |\n";
  EXPECT_THAT(CompareRooms(doc, {"src/core/", "src/engine/model/"}),
              testing::IsEmpty());
  EXPECT_THAT(CompareRooms(
                  doc, {"src/core/", "src/engine/model/", "src/engine/train/"}),
              testing::ElementsAre(
                  testing::HasSubstr("`src/engine/train/` holds sources but "
                                     "docs/architecture.md does not name it")));
  EXPECT_THAT(CompareRooms(doc, {"src/core/"}),
              testing::ElementsAre(testing::HasSubstr(
                  "names `src/engine/model/`, which holds no source file")));
}

}  // namespace
}  // namespace fusionrl
