// docs/config.md against the config schema: the reference table lists every
// key VisitJob() binds, no other key, and each key's default as a
// default-constructed JobConfig holds it. A key added to the schema without
// the doc, a key left in the doc after it is gone, or a default changed on
// one side only fails here, naming the key.
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/config_schema.h"
#include "fusionrl/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using config_internal::NumRule;
using config_internal::StrRule;

// One key of the schema: its dotted path, its default as text, and whether
// that text is a number (compared by value: the doc may write 1e-4).
struct SchemaKey {
  std::string default_text;
  bool numeric = false;
};

// A schema visitor that records every key with its default.
class DefaultsCollector {
 public:
  void Int(const char* key, int* v, const NumRule&) {
    Put(key, std::to_string(*v), true);
  }
  void Int64(const char* key, int64_t* v, const NumRule&) {
    Put(key, std::to_string(*v), true);
  }
  void Double(const char* key, double* v, const NumRule&) {
    Put(key, config_internal::FormatDouble(*v), true);
  }
  void Bool(const char* key, bool* v) {
    Put(key, *v ? "true" : "false", false);
  }
  void String(const char* key, std::string* v, const StrRule&) {
    Put(key, *v, false);
  }
  template <class E, class Parse>
  void Enum(const char* key, E* v, Parse, const char* (*name)(E)) {
    Put(key, name(*v), false);
  }
  template <class Body>
  void Section(const char* key, Body body) {
    prefix_.push_back(key);
    body();
    prefix_.pop_back();
  }

  std::map<std::string, SchemaKey> keys;

 private:
  void Put(const char* key, std::string text, bool numeric) {
    std::string path;
    for (const std::string& section : prefix_)
      absl::StrAppend(&path, section, ".");
    absl::StrAppend(&path, key);
    keys[path] = {std::move(text), numeric};
  }

  std::vector<std::string> prefix_;
};

std::map<std::string, SchemaKey> SchemaDefaults() {
  JobConfig config;
  DefaultsCollector collector;
  config_internal::VisitJob(config, collector);
  return collector.keys;
}

// One key as the doc lists it, with the line it is on.
struct DocKey {
  std::string key;
  std::string default_text;
  int line = 0;
};

// A table row's cells; "\|" inside a cell is a literal bar.
std::vector<std::string> SplitRow(absl::string_view row) {
  std::vector<std::string> cells;
  std::string cell;
  for (size_t i = 0; i < row.size(); ++i) {
    if (row[i] == '\\' && i + 1 < row.size() && row[i + 1] == '|') {
      cell += '|';
      ++i;
    } else if (row[i] == '|') {
      cells.push_back(std::string(absl::StripAsciiWhitespace(cell)));
      cell.clear();
    } else {
      cell += row[i];
    }
  }
  // The text before the first bar and after the last one is no cell.
  if (!cells.empty()) cells.erase(cells.begin());
  return cells;
}

// The words between backticks in `cell`, in order.
std::vector<std::string> Quoted(absl::string_view cell) {
  std::vector<std::string> words;
  std::vector<absl::string_view> parts = absl::StrSplit(cell, '`');
  for (size_t i = 1; i < parts.size(); i += 2) words.emplace_back(parts[i]);
  return words;
}

// A default cell's text: `""` is the empty string; a note in parentheses
// after the value ("\"\" (keep)") is not part of it.
std::string DefaultValue(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (absl::EndsWith(text, ")")) {
    size_t open = text.rfind(" (");
    if (open != absl::string_view::npos) text = text.substr(0, open);
  }
  text = absl::StripAsciiWhitespace(text);
  if (text == "\"\"") return "";
  return std::string(text);
}

// The keys of the reference table (the one under "| key | default |").
// A row may list several keys of one section: "`a.b.c`, `d`" is a.b.c and
// a.b.d, with one default each ("1, 4") or one default for all. Problems
// reading a row go to `problems`.
std::vector<DocKey> ReadDocTable(const std::string& doc,
                                 std::vector<std::string>& problems) {
  std::vector<DocKey> keys;
  std::istringstream in(doc);
  std::string line;
  bool in_table = false;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!in_table) {
      in_table = absl::StartsWith(line, "| key | default |");
      continue;
    }
    if (!absl::StartsWith(line, "|")) break;
    std::vector<std::string> cells = SplitRow(line);
    if (cells.size() < 2 || absl::StartsWith(cells[0], "---")) continue;
    std::vector<std::string> names = Quoted(cells[0]);
    if (names.empty()) {
      problems.push_back(
          absl::StrCat("docs/config.md:", number, ": a row without a `key`"));
      continue;
    }
    std::string prefix;
    size_t dot = names[0].rfind('.');
    if (dot != std::string::npos) prefix = names[0].substr(0, dot + 1);
    for (std::string& name : names) {
      if (&name != &names[0] && name.find('.') == std::string::npos) {
        name = prefix + name;
      }
    }
    std::vector<std::string> defaults = absl::StrSplit(cells[1], ", ");
    if (names.size() > 1 && defaults.size() != names.size()) {
      defaults.assign(names.size(), cells[1]);
    }
    if (defaults.size() != names.size()) {
      problems.push_back(absl::StrCat("docs/config.md:", number, ": ",
                                      names.size(), " keys but ",
                                      defaults.size(), " defaults"));
      continue;
    }
    for (size_t i = 0; i < names.size(); ++i) {
      keys.push_back({names[i], DefaultValue(defaults[i]), number});
    }
  }
  return keys;
}

bool SameDefault(const SchemaKey& schema, const std::string& doc) {
  if (!schema.numeric) return schema.default_text == doc;
  double want = 0;
  double got = 0;
  return absl::SimpleAtod(schema.default_text, &want) &&
         absl::SimpleAtod(doc, &got) && want == got;
}

// Every difference between the doc's table and the schema, one line each,
// naming the key.
std::vector<std::string> CompareWithSchema(const std::string& doc) {
  std::vector<std::string> problems;
  std::map<std::string, SchemaKey> schema = SchemaDefaults();
  std::map<std::string, int> listed;
  for (const DocKey& d : ReadDocTable(doc, problems)) {
    std::string where = absl::StrCat("docs/config.md:", d.line, ": `", d.key);
    if (!listed.emplace(d.key, d.line).second) {
      problems.push_back(absl::StrCat(
          where, "` is listed twice (first on line ", listed[d.key], ")"));
      continue;
    }
    auto it = schema.find(d.key);
    if (it == schema.end()) {
      problems.push_back(absl::StrCat(where, "` is not a key of the schema"));
    } else if (!SameDefault(it->second, d.default_text)) {
      problems.push_back(absl::StrCat(where, "` default is \"", d.default_text,
                                      "\", the schema's is \"",
                                      it->second.default_text, "\""));
    }
  }
  for (const auto& [key, value] : schema) {
    if (listed.count(key) == 0) {
      problems.push_back(absl::StrCat("docs/config.md: `", key, "` (default \"",
                                      value.default_text,
                                      "\") is missing from the table"));
    }
  }
  return problems;
}

std::string ReadDoc() {
  const char* root = std::getenv("FUSIONRL_SOURCE_DIR");
  std::string path = absl::StrCat(root != nullptr ? root : FUSIONRL_SOURCE_DIR,
                                  "/docs/config.md");
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ConfigDocsTest, TableListsExactlyTheSchemaKeysWithTheirDefaults) {
  std::vector<std::string> problems = CompareWithSchema(ReadDoc());
  EXPECT_THAT(problems, testing::IsEmpty())
      << "docs/config.md and the schema (core/config_schema.h) disagree:\n  "
      << absl::StrJoin(problems, "\n  ");
}

TEST(ConfigDocsTest, SchemaHasKeysInEverySection) {
  std::map<std::string, SchemaKey> schema = SchemaDefaults();
  EXPECT_EQ(schema.at("rollout.top_p").default_text, "1");
  EXPECT_EQ(schema.at("model.activations.policy").default_text, "keep");
  EXPECT_EQ(schema.at("model.rope_scaling.high_freq_factor").default_text, "4");
  EXPECT_GT(schema.size(), 150u);
}

// The comparison itself: a doc that drops a key, adds one, or states a wrong
// default is caught, each by name.
TEST(ConfigDocsTest, CatchesAMissingAnExtraAndAWrongKey) {
  const std::string header =
      "| key | default | range | meaning |\n|---|---|---|---|\n";
  std::string doc = ReadDoc();
  size_t table = doc.find("| key | default |");
  ASSERT_NE(table, std::string::npos);

  std::string without = doc;
  size_t row = without.find("| `rollout.top_p` |");
  ASSERT_NE(row, std::string::npos);
  without.erase(row, without.find('\n', row) + 1 - row);
  EXPECT_THAT(CompareWithSchema(without),
              testing::ElementsAre(testing::HasSubstr(
                  "`rollout.top_p` (default \"1\") is missing")));

  std::string extra = doc;
  extra.insert(extra.find('\n', table + header.size()) + 1,
               "| `rollout.top_q` | 1 | | |\n");
  EXPECT_THAT(CompareWithSchema(extra),
              testing::ElementsAre(testing::HasSubstr(
                  "`rollout.top_q` is not a key of the schema")));

  std::string wrong = doc;
  size_t cell = wrong.find("| `optim.lr` | 1e-4 |");
  ASSERT_NE(cell, std::string::npos);
  wrong.replace(cell, 20, "| `optim.lr` | 1e-3 |");
  EXPECT_THAT(
      CompareWithSchema(wrong),
      testing::ElementsAre(testing::HasSubstr(
          "`optim.lr` default is \"1e-3\", the schema's is \"1e-04\"")));

  std::string shared = header +
                       "| `model.rope_scaling.factor`, `low_freq_factor` | "
                       "1, 2 | | |\n";
  EXPECT_THAT(CompareWithSchema(shared),
              testing::Contains(testing::HasSubstr(
                  "`model.rope_scaling.low_freq_factor` default is \"2\"")));
}

}  // namespace
}  // namespace fusionrl
