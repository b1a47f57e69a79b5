"""`fusionrl chat-template` byte for byte against Python jinja2.

The reference is jinja2_reference.py (jinja2 set up as transformers'
apply_chat_template). Two checks, each exits 1 on any difference and prints
the counts and the first differences:

  conversations --model DIR --label NAME --fusionrl BIN --work DIR
                [--count 300] [--seed 1]
      --count generated conversations (system prompts present or absent,
      multi-turn, tools, assistant tool calls with null or text content,
      tool results, reasoning_content, CJK / emoji / combining marks,
      whitespace around every kind of text, <think> blocks,
      add_generation_prompt / enable_thinking on, off and absent, a few
      malformed ones) rendered with the model's template by both engines
      (`fusionrl chat-template --model DIR --now NOW`).
  probes --probes FILE --fusionrl BIN --work DIR
      Each line of FILE is {"name", "template", "variables"}: rendered by
      both (`fusionrl chat-template --inline-templates`), which must give
      the same text or both refuse.

Writes inputs.jsonl, expected.jsonl and actual.jsonl under --work. Run with
/usr/bin/python3 (Debian's jinja2) and TZ=UTC.
"""

import argparse
import json
import os
import random
import subprocess
import sys
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jinja2_reference as ref  # noqa: E402

# strftime_now's clock on both sides (naive local time, as datetime.now();
# the caller sets TZ=UTC so fusionrl's --now shows the same wall time).
NOW_ISO = "2024-07-26T12:34:56Z"
NOW = datetime(2024, 7, 26, 12, 34, 56)

TEXTS = [
    "Hello!",
    "What is 6 * 7?",
    "Explain recursion in one sentence.",
    "你好，世界！请用中文回答。",
    "こんにちは、元気ですか？",
    "안녕하세요",
    "emoji 👩🏽‍💻 and flags 🇯🇵 🎉",
    "combining: e\u0301 a\u0308 n\u0303 and Z\u0335\u0321a\u0336lgo",
    "  leading and trailing spaces  ",
    "\n\nnewlines around\n\n",
    " \n mixed spaces and newlines \n ",
    "tabs\tinside\tthe\ttext",
    "quotes \"double\" and 'single' and back\\slash",
    "a {{ fake }} tag and {% not a block %} and {# no comment #}",
    "multi\nline\ntext with a trailing newline\n",
    "JSON-ish: {\"a\": [1, 2, {\"b\": null}]}",
    "<tool_response>\nlooks like a tool response\n</tool_response>",
    "math: $\\frac{1}{2} + \\sqrt{x}$",
    "",
]

THINK_ANSWERS = [
    "<think>\nLet me think about it.\n</think>\n\nThe answer is 42.",
    "<think>\n\n</think>\n\nShort answer.",
    "<think>推理过程：先算 6 × 7。</think>答案是 42。",
    "Plain answer without thinking.",
    "\n<think>\nleading newline\n</think>\ntext after",
    "  <think> spaces before the tag </think>  \n answer with spaces ",
    "<think>unterminated thinking",
    "before</think>after",
]

SYSTEMS = [
    "You are a helpful assistant.",
    "You are a careful math tutor. Answer briefly.",
    "系统提示：你是一个有帮助的助手。",
    "  System prompt with surrounding whitespace \n",
    "Line one.\nLine two.",
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. 東京"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search",
        "description": "Search the web for \"query\".",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "max_results": {"type": "integer", "minimum": 1,
                            "maximum": 10}},
            "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.\nSupports + - * /.",
        "parameters": {"type": "object",
                       "properties": {"expression": {"type": "string"}},
                       "required": []}}},
]

ARGUMENTS = [
    {"city": "Paris"},
    {"city": "東京", "unit": "celsius"},
    {"query": "jinja \"templates\"", "max_results": 3},
    {"expression": "6 * 7"},
    {"nested": {"list": [1, 2, 3], "flag": True, "none": None,
                "ratio": 0.25}},
    {},
    "{\"city\": \"Berlin\"}",  # arguments given as a JSON string
]

REASONING = ["Thinking in the field.", "\nfield with newlines\n", ""]


def tool_turn(r, conv):
    calls = []
    for _ in range(1 + r.randrange(2)):
        calls.append({"type": "function", "function": {
            "name": r.choice(TOOLS)["function"]["name"],
            "arguments": r.choice(ARGUMENTS)}})
    # Null content (OpenAI style) is rare: Qwen3's template refuses it.
    content = None if r.random() < 0.08 else r.choice(
        ["", r.choice(THINK_ANSWERS)])
    conv["messages"].append(
        {"role": "assistant", "content": content, "tool_calls": calls})
    for _ in calls:
        conv["messages"].append(
            {"role": "tool", "content": r.choice(TEXTS) or "{}"})


def assistant_message(r):
    message = {"role": "assistant",
               "content": r.choice(THINK_ANSWERS + TEXTS)}
    if r.random() < 0.15:
        message["reasoning_content"] = r.choice(REASONING)
    return message


def generate(count, seed):
    r = random.Random(seed)
    conversations = []
    for _ in range(count):
        conv = {"messages": []}
        use_tools = r.random() < 0.35
        if use_tools:
            conv["tools"] = TOOLS[:1 + r.randrange(len(TOOLS))]
        if r.random() < 0.6:
            conv["messages"].append(
                {"role": "system", "content": r.choice(SYSTEMS)})
        turns = 1 + r.randrange(4)
        for t in range(turns):
            conv["messages"].append(
                {"role": "user", "content": r.choice(TEXTS)})
            if t == turns - 1 and r.random() < 0.6:
                break  # end on a user turn
            if use_tools and r.random() < 0.5:
                tool_turn(r, conv)
            conv["messages"].append(assistant_message(r))
        g = r.random()
        if g < 0.45:
            conv["add_generation_prompt"] = True
        elif g < 0.7:
            conv["add_generation_prompt"] = False
        e = r.random()
        if e < 0.3:
            conv["enable_thinking"] = True
        elif e < 0.6:
            conv["enable_thinking"] = False
        if r.random() < 0.1:
            conv["date_string"] = "01 Jan 2025"
        # Malformed: messages that are not a list, no messages, a number as
        # content (Python raises where a lenient engine would coerce).
        m = r.random()
        if m < 0.03:
            conv["messages"] = None
        elif m < 0.05:
            conv["messages"] = []
        elif m < 0.07 and conv["messages"]:
            conv["messages"][-1]["content"] = 42
        conversations.append(conv)
    return conversations


def run_fusionrl(fusionrl, args, lines, label):
    run = subprocess.run([fusionrl, "chat-template"] + args,
                         input="".join(line + "\n" for line in lines),
                         capture_output=True, text=True,
                         env={**os.environ, "TZ": "UTC"}, timeout=120)
    if run.returncode != 0:
        print(f"{label}: fusionrl chat-template exited {run.returncode}: "
              f"{run.stderr}")
        sys.exit(1)
    actual = []
    for line in run.stdout.split("\n")[:len(lines)]:
        try:
            parsed = json.loads(line)
        except ValueError:
            parsed = {"error": f"unparsable output line: {line!r}"}
        actual.append({"text": parsed} if isinstance(parsed, str) else parsed)
    while len(actual) < len(lines):
        actual.append({"error": "no output line"})
    return actual


def compare(label, inputs, expected, actual, work):
    os.makedirs(work, exist_ok=True)
    for name, rows in (("inputs", inputs), ("expected", expected),
                       ("actual", actual)):
        with open(os.path.join(work, name + ".jsonl"), "w",
                  encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    equal = refused = 0
    differences = []
    for i, (want, got) in enumerate(zip(expected, actual)):
        if "error" in want and "error" in got:
            equal += 1
            refused += 1
        elif "text" in want and want.get("text") == got.get("text"):
            equal += 1
        else:
            differences.append((i, want, got))
    print(f"{label}: {equal}/{len(inputs)} equal ({refused} refused by "
          f"both), {len(differences)} differ")
    for i, want, got in differences[:5]:
        print(f"--- {label} line {i + 1}: "
              f"{json.dumps(inputs[i], ensure_ascii=False)[:600]}")
        print(f"jinja2:   {json.dumps(want, ensure_ascii=False)[:600]}")
        print(f"fusionrl: {json.dumps(got, ensure_ascii=False)[:600]}")
    return not differences


def check_conversations(a):
    with open(os.path.join(a.model, "tokenizer_config.json"),
              encoding="utf-8") as f:
        config = json.load(f)
    source = config["chat_template"]
    if not isinstance(source, str):
        print(f"{a.label}: chat_template is not a string")
        return False
    env = ref.environment(NOW)
    conversations = generate(a.count, a.seed)
    expected = [ref.render_conversation(env, source, config, c)
                for c in conversations]
    lines = [json.dumps(c, ensure_ascii=False) for c in conversations]
    actual = run_fusionrl(a.fusionrl, ["--model", a.model, "--now", NOW_ISO],
                          lines, a.label)
    return compare(a.label, conversations, expected, actual, a.work)


def check_probes(a):
    probes = []
    with open(a.probes, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                probe = json.loads(line)
                probe.setdefault("variables", {})
                probe.setdefault("name", f"line {n}")
                probes.append(probe)
    env = ref.environment(NOW)
    expected = [ref.render_template(env, p["template"], p["variables"])
                for p in probes]
    lines = [json.dumps({"template": p["template"],
                         "variables": p["variables"]}, ensure_ascii=False)
             for p in probes]
    actual = run_fusionrl(a.fusionrl, ["--inline-templates", "--now", NOW_ISO],
                          lines, "probes")
    ok = compare("probes", probes, expected, actual, a.work)
    names = [p["name"] for p, w, g in zip(probes, expected, actual)
             if not (("error" in w and "error" in g)
                     or ("text" in w and w.get("text") == g.get("text")))]
    if names:
        print("differing probes: " + ", ".join(names))
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    conv = sub.add_parser("conversations")
    conv.add_argument("--model", required=True)
    conv.add_argument("--label", required=True)
    conv.add_argument("--count", type=int, default=300)
    conv.add_argument("--seed", type=int, default=1)
    probes = sub.add_parser("probes")
    probes.add_argument("--probes", required=True)
    for p in (conv, probes):
        p.add_argument("--fusionrl", required=True)
        p.add_argument("--work", required=True)
    a = parser.parse_args()
    ok = check_conversations(a) if a.command == "conversations" \
        else check_probes(a)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
