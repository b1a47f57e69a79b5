// `fusionrl tokenize`: encode / decode filters and the throughput benchmark
// (see tokenize_cli.h).
#include "cli/tokenize_cli.h"

#include <algorithm>
#include <chrono>
#include <istream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cli/common/exit_codes.h"
#include "core/clock.h"
#include "fusionrl/tokenizer.h"
#include "nlohmann/json.hpp"

namespace fusionrl::cli {
namespace {

using nlohmann::json;

// Seconds from `start` (a RealClock().MonotonicNow()) to now.
double SecondsSince(absl::Time start) {
  return RealClock().SecondsSince(start);
}

absl::Status LineError(int line_number, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat("stdin line ", line_number, ": ", message));
}

// One JSON string from a line of stdin.
absl::StatusOr<std::string> ParseTextLine(const std::string& line,
                                          int line_number) {
  json value = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return LineError(line_number, "not valid JSON");
  if (!value.is_string()) {
    return LineError(line_number, absl::StrCat("expected a JSON string, got ",
                                               value.type_name()));
  }
  return value.get<std::string>();
}

// One JSON array of ids from a line of stdin.
absl::StatusOr<std::vector<int>> ParseIdsLine(const std::string& line,
                                              int line_number) {
  json value = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return LineError(line_number, "not valid JSON");
  if (!value.is_array()) {
    return LineError(line_number, absl::StrCat("expected a JSON array of ids, "
                                               "got ",
                                               value.type_name()));
  }
  std::vector<int> ids;
  ids.reserve(value.size());
  for (const json& id : value) {
    if (!id.is_number_integer() || id.get<int64_t>() < INT32_MIN ||
        id.get<int64_t>() > INT32_MAX) {
      return LineError(line_number,
                       absl::StrCat("expected integer ids, got ", id.dump()));
    }
    ids.push_back(id.get<int>());
  }
  return ids;
}

void WriteIds(const std::vector<int>& ids, std::string* out) {
  out->push_back('[');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out->push_back(',');
    absl::StrAppend(out, ids[i]);
  }
  out->append("]\n");
}

int Encode(const Tokenizer& tok, std::istream& in, std::ostream& out) {
  std::string line;
  std::string buffer;
  for (int line_number = 1; std::getline(in, line); ++line_number) {
    auto text = ParseTextLine(line, line_number);
    absl::StatusOr<std::vector<int>> ids =
        text.ok() ? tok.Encode(*text) : text.status();
    if (!ids.ok()) {
      out << buffer << std::flush;  // the lines before the bad one
      return Fail(text.ok() ? LineError(line_number, ids.status().message())
                            : ids.status());
    }
    WriteIds(*ids, &buffer);
    if (buffer.size() > (1 << 16)) {
      out << buffer;
      buffer.clear();
    }
  }
  out << buffer << std::flush;
  return kExitOk;
}

int Decode(const Tokenizer& tok, std::istream& in, std::ostream& out) {
  std::string line;
  for (int line_number = 1; std::getline(in, line); ++line_number) {
    auto ids = ParseIdsLine(line, line_number);
    if (!ids.ok()) return Fail(ids.status());
    out << json(tok.DecodeWithSpecial(*ids))
               .dump(-1, ' ', false, json::error_handler_t::replace)
        << '\n';
  }
  out << std::flush;
  return kExitOk;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

int Bench(const TokenizeArgs& args, double load_seconds, const Tokenizer& tok,
          std::istream& in, std::ostream& out) {
  std::vector<std::string> corpus;
  std::string line;
  for (int line_number = 1; std::getline(in, line); ++line_number) {
    auto text = ParseTextLine(line, line_number);
    if (!text.ok()) return Fail(text.status());
    corpus.push_back(*std::move(text));
  }
  size_t corpus_bytes = 0;
  for (const auto& s : corpus) corpus_bytes += s.size();
  if (corpus_bytes == 0) {
    return Fail(absl::InvalidArgumentError("--bench: the corpus is empty"));
  }
  std::vector<const std::string*> texts;
  size_t bytes = 0;
  while (bytes < args.bench_mb * 1e6) {
    for (const auto& s : corpus) {
      texts.push_back(&s);
      bytes += s.size();
    }
  }
  std::vector<double> encode_mb_s;
  std::vector<double> decode_mb_s;
  size_t tokens = 0;
  std::vector<std::vector<int>> encoded(texts.size());
  for (int r = 0; r < args.repeats; ++r) {
    auto start = RealClock().MonotonicNow();
    tokens = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      auto ids = tok.Encode(*texts[i]);
      if (!ids.ok()) return Fail(ids.status());
      tokens += ids->size();
      encoded[i] = *std::move(ids);
    }
    encode_mb_s.push_back(bytes / 1e6 / SecondsSince(start));
    start = RealClock().MonotonicNow();
    size_t decoded_bytes = 0;
    for (const auto& ids : encoded) {
      decoded_bytes += tok.DecodeWithSpecial(ids).size();
    }
    decode_mb_s.push_back(decoded_bytes / 1e6 / SecondsSince(start));
  }
  const json report = {
      {"implementation", "fusionrl"},
      {"load_s", load_seconds},
      {"corpus_strings", corpus.size()},
      {"bytes", bytes},
      {"tokens", tokens},
      {"encode_mb_s", encode_mb_s},
      {"encode_median_mb_s", Median(encode_mb_s)},
      {"decode_median_mb_s", Median(decode_mb_s)},
  };
  out << report.dump() << std::endl;
  return kExitOk;
}

}  // namespace

CLI::App* AddTokenizeCommand(CLI::App& app, TokenizeArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "encode JSON strings (one a line on stdin) to JSON id arrays with a "
      "Hugging Face tokenizer, or decode with --decode");
  cmd->add_option("--tokenizer", args.tokenizer_dir,
                  "directory with tokenizer.json (+ tokenizer_config.json)")
      ->required();
  auto* decode = cmd->add_flag(
      "--decode", args.decode,
      "read JSON id arrays and write JSON strings (special tokens kept)");
  cmd->add_flag("--bench", args.bench,
                "encode the stdin corpus repeated to --bench-mb MB, "
                "--repeats times; print load time and MB/s as JSON")
      ->excludes(decode);
  cmd->add_option("--bench-mb", args.bench_mb,
                  "--bench: corpus size in MB (default 5)")
      ->check(CLI::Range(0.001, 10000.0));
  cmd->add_option("--repeats", args.repeats,
                  "--bench: timed passes, median reported (default 3)")
      ->check(CLI::Range(1, 1000));
  return cmd;
}

int RunTokenize(const TokenizeArgs& args, std::istream& in, std::ostream& out) {
  const auto start = RealClock().MonotonicNow();
  auto tok = LoadTokenizer(args.tokenizer_dir);
  if (!tok.ok()) return Fail(tok.status());
  const double load_seconds = SecondsSince(start);
  if (args.bench) return Bench(args, load_seconds, **tok, in, out);
  if (args.decode) return Decode(**tok, in, out);
  return Encode(**tok, in, out);
}

}  // namespace fusionrl::cli
