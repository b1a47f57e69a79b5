// The chat-template lexer: template text to tokens, applying Jinja's
// whitespace control the way transformers configures it (trim_blocks,
// lstrip_blocks, keep_trailing_newline=False) plus `{%-`/`-%}` stripping and
// `{%+`/`+%}` opt-outs, and dropping comments.
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "template/jinja_internal.h"

namespace fusionrl::jinja::internal {
namespace {

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
         c == '\v';
}
bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// Removes trailing whitespace (Python's str.rstrip) from `text`.
void RStrip(std::string* text) {
  std::vector<uint32_t> cps = DecodeUtf8(*text);
  size_t n = cps.size();
  while (n > 0 && IsPythonSpace(cps[n - 1])) --n;
  cps.resize(n);
  *text = EncodeUtf8(cps);
}

class Lexer {
 public:
  // jinja2 first turns every \r\n and \r of the source into \n
  // (newline_sequence), then drops one trailing newline
  // (keep_trailing_newline=False).
  explicit Lexer(absl::string_view source) : normalized_(Normalize(source)) {
    src_ = normalized_;
    if (!src_.empty() && src_.back() == '\n') src_.remove_suffix(1);
  }

  std::vector<Token> Run() {
    while (pos_ < src_.size()) {
      size_t tag = FindTag(pos_);
      std::string text(src_.substr(pos_, tag - pos_));
      if (tag == src_.size()) {
        AddText(std::move(text), pos_);
        break;
      }
      const char type = src_[tag + 1];  // '{', '%' or '#'
      const char modifier = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (modifier == '-') {
        RStrip(&text);
      } else if (modifier != '+' && type != '{') {
        LStripBlock(&text, tag);
      }
      AddText(std::move(text), pos_);
      pos_ = tag + 2 + (modifier == '-' || modifier == '+' ? 1 : 0);
      if (type == '#') {
        LexComment(tag);
      } else {
        LexTag(type == '%');
      }
    }
    tokens_.push_back({Token::Kind::kEnd, "", LineAt(src_.size())});
    return std::move(tokens_);
  }

 private:
  // The position of the next "{{", "{%" or "{#" at or after `from`, or the
  // end of the source.
  size_t FindTag(size_t from) const {
    while (true) {
      size_t brace = src_.find('{', from);
      if (brace == absl::string_view::npos || brace + 1 >= src_.size()) {
        return src_.size();
      }
      const char next = src_[brace + 1];
      if (next == '{' || next == '%' || next == '#') return brace;
      from = brace + 1;
    }
  }

  int LineAt(size_t pos) {
    // Incremental: positions are asked for in increasing order.
    for (; line_pos_ < pos && line_pos_ < src_.size(); ++line_pos_) {
      if (src_[line_pos_] == '\n') ++line_;
    }
    return line_;
  }

  // lstrip_blocks: the spaces and tabs between the start of the line and a
  // block or comment tag are removed, if nothing else precedes the tag on
  // its line.
  void LStripBlock(std::string* text, size_t tag) const {
    size_t n = text->size();
    while (n > 0 && ((*text)[n - 1] == ' ' || (*text)[n - 1] == '\t')) --n;
    const size_t line_start_in_source = tag - (text->size() - n);
    const bool at_line_start = n > 0
                                   ? (*text)[n - 1] == '\n'
                                   : line_start_in_source == 0 ||
                                         src_[line_start_in_source - 1] == '\n';
    if (at_line_start) text->resize(n);
  }

  void AddText(std::string text, size_t at) {
    if (text.empty()) return;
    tokens_.push_back({Token::Kind::kText, std::move(text), LineAt(at)});
  }

  // After a tag's closing delimiter: `-` strips all following whitespace;
  // trim_blocks removes one newline after a block or comment unless `+`.
  void AfterTag(char modifier, bool is_block) {
    if (modifier == '-') {
      while (pos_ < src_.size() && IsAsciiSpace(src_[pos_])) ++pos_;
    } else if (modifier != '+' && is_block && pos_ < src_.size() &&
               src_[pos_] == '\n') {
      ++pos_;
    }
  }

  void LexComment(size_t tag) {
    const size_t end = src_.find("#}", pos_);
    if (end == absl::string_view::npos) {
      FailAt(LineAt(tag), "unclosed comment: missing '#}'");
    }
    const char modifier = end > pos_ ? src_[end - 1] : '\0';
    pos_ = end + 2;
    AfterTag(modifier, /*is_block=*/true);
  }

  void LexTag(bool is_block) {
    const int open_line = LineAt(pos_);
    tokens_.push_back(
        {is_block ? Token::Kind::kBlockBegin : Token::Kind::kVarBegin, "",
         open_line});
    const size_t first_token = tokens_.size();
    int depth = 0;  // open brackets: "}}" inside a dict literal is not an end
    while (true) {
      while (pos_ < src_.size() && IsAsciiSpace(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) {
        FailAt(open_line, is_block ? "unclosed tag: missing '%}'"
                                   : "unclosed expression: missing '}}'");
      }
      const absl::string_view rest = src_.substr(pos_);
      const absl::string_view close = is_block ? "%}" : "}}";
      const bool has_modifier = rest[0] == '-' || rest[0] == '+';
      if (depth == 0 && (rest.substr(0, 2) == close ||
                         (has_modifier && rest.substr(1, 2) == close))) {
        const char modifier = has_modifier ? rest[0] : '\0';
        if (modifier == '+' && !is_block) {
          FailAt(LineAt(pos_), "'+}}' is not valid whitespace control");
        }
        pos_ += has_modifier ? 3 : 2;
        tokens_.push_back(
            {is_block ? Token::Kind::kBlockEnd : Token::Kind::kVarEnd, "",
             LineAt(pos_)});
        // jinja2's raw_begin rule has no trim_blocks suffix: the newline
        // after `{% raw %}` is text (`{% raw -%}` still strips).
        const bool raw = is_block && tokens_.size() == first_token + 2 &&
                         tokens_[first_token].kind == Token::Kind::kName &&
                         tokens_[first_token].value == "raw";
        AfterTag(modifier, is_block && !raw);
        break;
      }
      LexOne(&depth);
    }
    if (is_block && tokens_.size() == first_token + 2 &&
        tokens_[first_token].kind == Token::Kind::kName &&
        tokens_[first_token].value == "raw") {
      LexRaw(open_line);
    }
  }

  // One token inside {{ }} or {% %}.
  void LexOne(int* depth) {
    const int line = LineAt(pos_);
    const char c = src_[pos_];
    if (IsNameStart(c)) {
      size_t end = pos_;
      while (end < src_.size() && IsNameChar(src_[end])) ++end;
      tokens_.push_back({Token::Kind::kName,
                         std::string(src_.substr(pos_, end - pos_)), line});
      pos_ = end;
      return;
    }
    if (IsDigit(c)) {
      LexNumber(line);
      return;
    }
    if (c == '\'' || c == '"') {
      LexString(line);
      return;
    }
    static constexpr const char* kOperators[] = {
        "//", "**", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ",",
        ".",  ":",  "|",  "=",  "+",  "-",  "*", "/", "%", "~", "<", ">"};
    for (const char* op : kOperators) {
      const size_t n = std::strlen(op);
      if (src_.substr(pos_, n) == op) {
        if (op[0] == '(' || op[0] == '[' || op[0] == '{') ++*depth;
        if (op[0] == ')' || op[0] == ']' || op[0] == '}') --*depth;
        tokens_.push_back({Token::Kind::kOperator, op, line});
        pos_ += n;
        return;
      }
    }
    FailAt(line,
           absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  void LexNumber(int line) {
    size_t end = pos_;
    auto digits = [&] {
      while (end < src_.size() && (IsDigit(src_[end]) || src_[end] == '_')) {
        ++end;
      }
    };
    digits();
    bool is_float = false;
    // `messages.0.content`: a dot after an attribute index is not a decimal
    // point.
    const bool after_dot = !tokens_.empty() &&
                           tokens_.back().kind == Token::Kind::kOperator &&
                           tokens_.back().value == ".";
    if (!after_dot && end + 1 < src_.size() && src_[end] == '.' &&
        IsDigit(src_[end + 1])) {
      ++end;
      digits();
      is_float = true;
    }
    if (!after_dot && end < src_.size() &&
        (src_[end] == 'e' || src_[end] == 'E')) {
      size_t exp = end + 1;
      if (exp < src_.size() && (src_[exp] == '+' || src_[exp] == '-')) ++exp;
      if (exp < src_.size() && IsDigit(src_[exp])) {
        end = exp;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (char ch : src_.substr(pos_, end - pos_)) {
      if (ch != '_') text.push_back(ch);
    }
    tokens_.push_back(
        {is_float ? Token::Kind::kFloat : Token::Kind::kInt, text, line});
    pos_ = end;
  }

  // A string literal with Python's escapes (\n \t \r \b \f \v \0 \\ \' \"
  // \xHH \uHHHH \UHHHHHHHH; an unknown escape is kept as written).
  void LexString(int line) {
    const char quote = src_[pos_++];
    std::string value;
    while (true) {
      if (pos_ >= src_.size()) FailAt(line, "unterminated string literal");
      const char c = src_[pos_++];
      if (c == quote) break;
      if (c != '\\') {
        value.push_back(c);
        continue;
      }
      if (pos_ >= src_.size()) FailAt(line, "unterminated string literal");
      const char e = src_[pos_++];
      switch (e) {
        case 'n':
          value.push_back('\n');
          break;
        case 't':
          value.push_back('\t');
          break;
        case 'r':
          value.push_back('\r');
          break;
        case 'b':
          value.push_back('\b');
          break;
        case 'f':
          value.push_back('\f');
          break;
        case 'v':
          value.push_back('\v');
          break;
        case '0':
          value.push_back('\0');
          break;
        case '\\':
          value.push_back('\\');
          break;
        case '\'':
          value.push_back('\'');
          break;
        case '"':
          value.push_back('"');
          break;
        case '\n':
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t i = 0; i < n; ++i) {
            const char h = pos_ + i < src_.size() ? src_[pos_ + i] : '\0';
            int d = IsDigit(h)               ? h - '0'
                    : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                    : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                             : -1;
            if (d < 0) {
              FailAt(line, absl::StrCat("invalid \\", std::string(1, e),
                                        " escape in a string literal"));
            }
            cp = cp * 16 + d;
          }
          pos_ += n;
          AppendUtf8(cp, &value);
          break;
        }
        default:
          value.push_back('\\');
          value.push_back(e);
      }
    }
    tokens_.push_back({Token::Kind::kString, std::move(value), line});
  }

  // After `{% raw %}`: the text up to `{% endraw %}` is literal.
  void LexRaw(int line) {
    tokens_.resize(tokens_.size() - 3);  // {% raw %}
    size_t search = pos_;
    while (true) {
      const size_t tag = src_.find("{%", search);
      if (tag == absl::string_view::npos) {
        FailAt(line, "unclosed 'raw' block: missing '{% endraw %}'");
      }
      size_t p = tag + 2;
      const char open_modifier = p < src_.size() ? src_[p] : '\0';
      if (open_modifier == '-' || open_modifier == '+') ++p;
      while (p < src_.size() && IsAsciiSpace(src_[p])) ++p;
      if (src_.substr(p, 6) != "endraw") {
        search = tag + 2;
        continue;
      }
      p += 6;
      while (p < src_.size() && IsAsciiSpace(src_[p])) ++p;
      char close_modifier = '\0';
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) {
        close_modifier = src_[p++];
      }
      if (src_.substr(p, 2) != "%}") {
        search = tag + 2;
        continue;
      }
      std::string text(src_.substr(pos_, tag - pos_));
      if (open_modifier == '-') {
        RStrip(&text);
      } else if (open_modifier != '+') {
        LStripBlock(&text, tag);
      }
      AddText(std::move(text), pos_);
      pos_ = p + 2;
      AfterTag(close_modifier, /*is_block=*/true);
      return;
    }
  }

  static std::string Normalize(absl::string_view source) {
    std::string out;
    out.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] != '\r') {
        out.push_back(source[i]);
        continue;
      }
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    }
    return out;
  }

  std::string normalized_;
  absl::string_view src_;
  size_t pos_ = 0;
  size_t line_pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> Tokenize(absl::string_view source) {
  return Lexer(source).Run();
}

}  // namespace fusionrl::jinja::internal
