// A Jinja interpreter for Hugging Face chat templates, with the semantics of
// transformers' renderer: jinja2's ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks and the loopcontrols extension, plus the
// globals transformers adds (raise_exception, strftime_now), its
// `generation` tag and its `tojson` (json.dumps, non-ASCII kept). The
// byte-exactness reference in tests is Python jinja2 set up that way
// (tests/chat_template/jinja2_reference.py).
//
// A template is parsed once into an immutable AST and rendered many times.
// What the interpreter does not implement is refused with an error naming
// the construct and the template line ("chat template line 12: unsupported
// filter 'wordwrap'"), at parse time when the name is known then; nothing is
// rendered approximately. As in jinja2, printing undefined gives "" and an
// attribute or item of an undefined value is an error (UndefinedError).
//
// Thread safety: a Template is immutable; Render may be called from many
// threads at once. Copies share the AST.
#ifndef FUSIONRL_TEMPLATE_JINJA_H_
#define FUSIONRL_TEMPLATE_JINJA_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json_fwd.hpp"

namespace fusionrl::jinja {

struct RenderOptions {
  // The clock of strftime_now(format), shown in `time_zone` (transformers
  // formats datetime.now(), the local time).
  absl::Time now = absl::UnixEpoch();
  absl::TimeZone time_zone = absl::LocalTimeZone();
  // Guards against hostile templates; exceeding one is ResourceExhausted.
  size_t max_output_bytes = size_t{64} << 20;  // also caps any one string
  int max_call_depth = 100;                    // nested macro calls
  int64_t max_loop_iterations = 10'000'000;    // all loops of one render
};

namespace internal {
struct Program;
}  // namespace internal

class Template {
 public:
  // An empty template (renders ""); assign a parsed one.
  Template();

  // Parses `source` (the chat_template text). InvalidArgument on a syntax
  // error or an unsupported tag, filter or test, naming the line.
  static absl::StatusOr<Template> Parse(std::string_view source);

  // Renders with `variables` (a JSON object: its keys become template
  // variables, JSON values map onto Jinja values with key order kept).
  // Errors: InvalidArgument for a template error at render time (a type
  // error, raise_exception(msg): the message contains msg), ResourceExhausted
  // when a RenderOptions limit is hit. Both name the template line.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& variables,
                                     const RenderOptions& options) const;

 private:
  explicit Template(std::shared_ptr<const internal::Program> program);

  std::shared_ptr<const internal::Program> program_;  // never null
};

}  // namespace fusionrl::jinja

#endif  // FUSIONRL_TEMPLATE_JINJA_H_
