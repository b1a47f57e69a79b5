#!/usr/bin/env bash
# Makes the Hugging Face test fixtures (tiny Qwen2 / Qwen3 / Llama models with
# the real Qwen3 vocabulary, golden logits from an independent PyTorch
# forward) into OUT_DIR, for hf_model_test. Needs the Qwen3 tokenizer files
# that scripts/fetch-test-data.sh fetches, and Debian's python3-torch; when
# either is missing it says so and exits 0 (the tests then skip).
# Usage: scripts/make-test-fixtures.sh OUT_DIR
set -euo pipefail
out=${1:?usage: make-test-fixtures.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
data=${FUSIONRL_TEST_DATA:-$HOME/.cache/fusionrl/test-data}
tok="$data/qwen3-tokenizer"
if [ ! -f "$tok/tokenizer.json" ]; then
  echo "make-test-fixtures: SKIP: no Qwen3 tokenizer at $tok (run scripts/fetch-test-data.sh)"
  exit 0
fi
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "make-test-fixtures: SKIP: /usr/bin/python3 has no torch (apt-get install python3-torch)"
  exit 0
fi
# Up to date when the script and the tokenizer are older than the stamp.
stamp="$out/.stamp"
if [ -f "$stamp" ] && [ "$stamp" -nt "$here/make_hf_fixtures.py" ] &&
   [ "$stamp" -nt "$tok/tokenizer.json" ]; then
  echo "make-test-fixtures: up to date in $out"
  exit 0
fi
rm -rf "$out.tmp"
/usr/bin/python3 "$here/make_hf_fixtures.py" --tokenizer-dir "$tok" --out "$out.tmp"
rm -rf "$out"
mv "$out.tmp" "$out"
touch "$stamp"
