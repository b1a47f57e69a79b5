"""Python jinja2 set up exactly as transformers' apply_chat_template sets it up.

The reference of FusionRL's chat-template interpreter (src/template/jinja*.cc).
Written from transformers' `utils/chat_template_utils.py`
(`_compile_jinja_template`, `render_jinja_template`) and
`PreTrainedTokenizerBase.apply_chat_template` / `special_tokens_map`; never
from FusionRL's code. Needs Debian's python3-jinja2 (3.1.2): run it with
/usr/bin/python3.

  environment(now)      ImmutableSandboxedEnvironment(trim_blocks=True,
                        lstrip_blocks=True, extensions=[AssistantTracker,
                        loopcontrols]) with transformers' tojson filter and
                        the raise_exception / strftime_now globals
                        (strftime_now reads `now` instead of the clock).
  special_tokens(cfg)   tokenizer.special_tokens_map of a tokenizer_config.json
  render_conversation   apply_chat_template(tokenize=False)'s render call
  render_template       one template with exactly the given variables

Each render returns {"text": str} or {"error": str} (any exception: both
engines refusing counts as agreement).
"""

import json
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES, in its order.
SPECIAL_TOKENS_ATTRIBUTES = [
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
    "cls_token", "mask_token", "additional_special_tokens",
]


class AssistantTracker(jinja2.ext.Extension):
    """transformers' `{% generation %}...{% endgeneration %}` tag.

    Outside return_assistant_tokens_mask the tracker is inactive: the tag
    renders its body (a CallBlock whose caller() output is returned).
    """

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"],
                                       drop_needle=True)
        return jinja2.nodes.CallBlock(
            self.call_method("_generation_support"), [], [], body
        ).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None,
           sort_keys=False):
    # transformers replaces jinja2's tojson (which escapes HTML) with this.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def environment(now=None):
    """transformers' chat-template environment; `now` pins strftime_now
    (a datetime; None: the clock, as transformers)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[AssistantTracker, jinja2.ext.loopcontrols])

    def strftime_now(fmt):
        return (now or datetime.now()).strftime(fmt)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def _token_text(value):
    # An AddedToken serialized as {"content": ...}, or a plain string.
    if isinstance(value, dict):
        return value.get("content")
    return value


def special_tokens(config):
    """tokenizer.special_tokens_map: each attribute that is set and
    non-empty (transformers keeps `if attr_value:`), as strings."""
    tokens = {}
    for attr in SPECIAL_TOKENS_ATTRIBUTES:
        value = config.get(attr)
        if attr == "additional_special_tokens":
            value = [str(_token_text(v)) for v in (value or [])]
        else:
            value = _token_text(value)
            value = None if value is None else str(value)
        if value:
            tokens[attr] = value
    return tokens


_compiled = {}


def _compile(env, source):
    # transformers caches its compiled template too (lru_cache).
    key = (id(env), source)
    if key not in _compiled:
        _compiled[key] = env.from_string(source)
    return _compiled[key]


def _render(compile_fn, render_fn):
    try:
        template = compile_fn()
        return {"text": render_fn(template)}
    except Exception as e:  # noqa: BLE001 - any refusal is a refusal
        return {"error": f"{type(e).__name__}: {e}"}


def render_conversation(env, source, config, conversation):
    """apply_chat_template(conversation["messages"], tools=..., documents=
    ..., add_generation_prompt=..., tokenize=False, **other keys)."""
    kwargs = dict(conversation)
    messages = kwargs.pop("messages", None)
    tools = kwargs.pop("tools", None)
    documents = kwargs.pop("documents", None)
    add_generation_prompt = kwargs.pop("add_generation_prompt", False)
    # template_kwargs = {**self.special_tokens_map, **kwargs}
    template_kwargs = {**special_tokens(config), **kwargs}
    return _render(
        lambda: _compile(env, source),
        lambda t: t.render(messages=messages, tools=tools,
                           documents=documents,
                           add_generation_prompt=add_generation_prompt,
                           **template_kwargs))


def render_template(env, source, variables):
    return _render(lambda: env.from_string(source),
                   lambda t: t.render(**variables))
