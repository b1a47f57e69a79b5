// Byte-exactness check of `fusionrl chat-template` against @huggingface/jinja
// (transformers.js's engine) on a model's real chat template.
//
//   node gen_and_render.mjs --jinja HF_JINJA_DIST_INDEX_JS --model DIR
//        --label NAME --fusionrl BINARY --work DIR [--count 300] [--seed 1]
//
// Builds --count conversations from a fixed seed (system prompts present or
// absent, multi-turn, tool definitions, assistant tool calls, tool results,
// empty content, CJK / emoji / combining marks, <think> blocks in assistant
// history, add_generation_prompt and enable_thinking on, off and absent, a
// few malformed ones), renders each with @huggingface/jinja and with
// `fusionrl chat-template --now NOW`, and compares them line by line. Prints
// e.g. "qwen3: 300/300 equal (12 rejected by both)" and the first
// differences; exits 1 on any difference. Writes inputs.jsonl,
// expected.jsonl and actual.jsonl under --work for inspection.
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import path from "node:path";

// A fixed clock for strftime_now on both sides (TZ=UTC is set by the
// caller; fusionrl gets the same instant through --now).
const NOW_ISO = "2024-07-26T12:34:56Z";

function parseArgs(argv) {
  const args = { count: 300, seed: 1 };
  for (let i = 2; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, "");
    args[key] = argv[i + 1];
  }
  for (const required of ["jinja", "model", "label", "fusionrl", "work"]) {
    if (!args[required]) {
      console.error(`gen_and_render.mjs: --${required} is required`);
      process.exit(2);
    }
  }
  args.count = Number(args.count);
  args.seed = Number(args.seed);
  return args;
}

// mulberry32: a small deterministic PRNG.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const TEXTS = [
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
  "tabs\tinside\tthe\ttext",
  'quotes "double" and \'single\' and back\\slash',
  "a {{ fake }} tag and {% not a block %} and {# no comment #}",
  "multi\nline\ntext with a trailing newline\n",
  "JSON-ish: {\"a\": [1, 2, {\"b\": null}]}",
  "<tool_response>\nlooks like a tool response\n</tool_response>",
  "math: $\\frac{1}{2} + \\sqrt{x}$",
  "",
];

// Assistant texts avoid leading / trailing spaces: @huggingface/jinja
// 0.5.x ignores the argument of str.strip/lstrip/rstrip (Qwen3's template
// calls content.lstrip('\n')) and strips all whitespace, where Python (and
// fusionrl) strip only the characters given.
const ASSISTANT_TEXTS = TEXTS.filter((t) => {
  const inner = t.replace(/^\n+|\n+$/g, "");
  return inner.trim() === inner; // only newlines around the text
});

const THINK_ANSWERS = [
  "<think>\nLet me think about it.\n</think>\n\nThe answer is 42.",
  "<think>\n\n</think>\n\nShort answer.",
  "<think>推理过程：先算 6 × 7。</think>答案是 42。",
  "Plain answer without thinking.",
  "\n<think>\nleading newline\n</think>\ntext after",
  "<think>unterminated thinking",
  "before</think>after",
];

const SYSTEMS = [
  "You are a helpful assistant.",
  "You are a careful math tutor. Answer briefly.",
  "系统提示：你是一个有帮助的助手。",
  "  System prompt with surrounding whitespace \n",
  "Line one.\nLine two.",
];

const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Get the current weather in a city.",
      parameters: {
        type: "object",
        properties: {
          city: { type: "string", description: "City name, e.g. 東京" },
          unit: { type: "string", enum: ["celsius", "fahrenheit"] },
        },
        required: ["city"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "search",
      description: 'Search the web for "query".',
      parameters: {
        type: "object",
        properties: {
          query: { type: "string" },
          max_results: { type: "integer", minimum: 1, maximum: 10 },
        },
        required: ["query"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "calculator",
      description: "Evaluate an arithmetic expression.\nSupports + - * /.",
      parameters: {
        type: "object",
        properties: { expression: { type: "string" } },
        required: [],
      },
    },
  },
];

const ARGUMENTS = [
  { city: "Paris" },
  { city: "東京", unit: "celsius" },
  { query: "jinja \"templates\"", max_results: 3 },
  { expression: "6 * 7" },
  { nested: { list: [1, 2, 3], flag: true, none: null, ratio: 0.25 } },
  {},
  '{"city": "Berlin"}', // arguments given as a JSON string
];

function generate(count, seed) {
  const r = rng(seed);
  const pick = (xs) => xs[Math.floor(r() * xs.length)];
  const conversations = [];
  for (let i = 0; i < count; ++i) {
    const conv = { messages: [] };
    const useTools = r() < 0.35;
    if (useTools) {
      conv.tools = TOOLS.slice(0, 1 + Math.floor(r() * TOOLS.length));
    }
    if (r() < 0.6) conv.messages.push({ role: "system", content: pick(SYSTEMS) });
    const turns = 1 + Math.floor(r() * 4);
    for (let t = 0; t < turns; ++t) {
      conv.messages.push({ role: "user", content: pick(TEXTS) });
      const last = t === turns - 1;
      if (last && r() < 0.6) break; // end on a user turn
      if (useTools && r() < 0.5) {
        const calls = [];
        const n = 1 + Math.floor(r() * 2);
        for (let c = 0; c < n; ++c) {
          calls.push({
            type: "function",
            function: { name: pick(TOOLS).function.name, arguments: pick(ARGUMENTS) },
          });
        }
        conv.messages.push({
          role: "assistant",
          content: r() < 0.5 ? "" : pick(THINK_ANSWERS),
          tool_calls: calls,
        });
        for (let c = 0; c < n; ++c) {
          conv.messages.push({ role: "tool", content: pick(TEXTS) || "{}" });
        }
      }
      conv.messages.push({ role: "assistant", content: r() < 0.5 ? pick(THINK_ANSWERS) : pick(ASSISTANT_TEXTS) });
    }
    const g = r();
    if (g < 0.45) conv.add_generation_prompt = true;
    else if (g < 0.7) conv.add_generation_prompt = false;
    const e = r();
    if (e < 0.3) conv.enable_thinking = true;
    else if (e < 0.6) conv.enable_thinking = false;
    // A few malformed conversations: messages that are not a list (both
    // engines reject them) and no messages at all. (Non-string content is
    // left out: @huggingface/jinja coerces numbers where Python raises.)
    const m = r();
    if (m < 0.03) conv.messages = null;
    else if (m < 0.05) conv.messages = [];
    conversations.push(conv);
  }
  return conversations;
}

function loadConfig(modelDir) {
  const config = JSON.parse(readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8"));
  const token = (t) => (t == null ? "" : typeof t === "string" ? t : t.content ?? "");
  return { template: config.chat_template, bos: token(config.bos_token), eos: token(config.eos_token) };
}

async function main() {
  const args = parseArgs(process.argv);
  const { Template } = await import(pathToFileURL(path.resolve(args.jinja)).href);
  // strftime_now reads `new Date()`: pin it to NOW_ISO.
  const RealDate = Date;
  globalThis.Date = class extends RealDate {
    constructor(...a) {
      super(...(a.length ? a : [NOW_ISO]));
    }
  };
  const { template, bos, eos } = loadConfig(args.model);
  if (typeof template !== "string") {
    console.error(`${args.label}: chat_template is not a string`);
    process.exit(2);
  }
  const compiled = new Template(template);
  const conversations = generate(args.count, args.seed);
  const expected = conversations.map((conv) => {
    try {
      return { text: compiled.render({ bos_token: bos, eos_token: eos, add_generation_prompt: false, ...conv }) };
    } catch (e) {
      return { error: String(e.message ?? e) };
    }
  });

  mkdirSync(args.work, { recursive: true });
  const inputs = conversations.map((c) => JSON.stringify(c)).join("\n") + "\n";
  writeFileSync(path.join(args.work, "inputs.jsonl"), inputs);
  writeFileSync(path.join(args.work, "expected.jsonl"), expected.map((x) => JSON.stringify(x)).join("\n") + "\n");
  const run = spawnSync(args.fusionrl, ["chat-template", "--model", args.model, "--now", NOW_ISO], {
    input: inputs,
    encoding: "utf8",
    maxBuffer: 1 << 30,
    env: { ...process.env, TZ: "UTC" },
  });
  writeFileSync(path.join(args.work, "actual.jsonl"), run.stdout ?? "");
  if (run.status !== 0) {
    console.error(`${args.label}: fusionrl chat-template exited ${run.status}: ${run.stderr}`);
    process.exit(1);
  }
  const actual = run.stdout.split("\n").filter((l, i, a) => i < a.length - 1 || l !== "");
  let equal = 0;
  let rejectedByBoth = 0;
  const differences = [];
  for (let i = 0; i < conversations.length; ++i) {
    const want = expected[i];
    let got;
    try {
      const parsed = JSON.parse(actual[i] ?? "null");
      got = typeof parsed === "string" ? { text: parsed } : parsed ?? { error: "no output line" };
    } catch {
      got = { error: `unparsable output line: ${actual[i]}` };
    }
    if (want.error !== undefined && got.error !== undefined) {
      ++equal;
      ++rejectedByBoth;
    } else if (want.text !== undefined && want.text === got.text) {
      ++equal;
    } else {
      differences.push({ line: i + 1, input: conversations[i], want, got });
    }
  }
  console.log(`${args.label}: ${equal}/${conversations.length} equal (${rejectedByBoth} rejected by both)`);
  for (const d of differences.slice(0, 3)) {
    console.log(`--- ${args.label} line ${d.line}: ${JSON.stringify(d.input)}`);
    console.log(`want: ${JSON.stringify(d.want)}`);
    console.log(`got:  ${JSON.stringify(d.got)}`);
  }
  process.exit(differences.length === 0 ? 0 : 1);
}

main();
