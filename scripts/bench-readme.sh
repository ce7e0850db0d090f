#!/usr/bin/env bash
# Regenerates the README's performance tables: runs every manifest in benchmarks/manifests (the
# smoke one included), writes their artifacts to benchmarks/artifacts, renders reports (Markdown
# and SVG charts) to benchmarks/reports, and fills the README's `<!-- bench:NAME -->` sections.
# About 30 minutes on 2 cores; run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup-tests.sh
cargo build --release --bin axle
axle=./target/release/axle
# The MoE and hybrid manifests run on random-weight files of real shapes (none can be fetched here).
models="${AXLE_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/axle/models}"
venv="${AXLE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/axle/venv}"
for shape in qwen3moe-1b qwen35moe-1b; do
  if [ ! -f "$models/$shape-q4_k_m.gguf" ]; then
    "$venv/bin/python" scripts/make-bench-model.py --shape "$shape" --type q4_k_m \
      --vocab-from "$models/SmolLM2-135M-Instruct.Q4_1.gguf" --out "$models/$shape-q4_k_m.gguf"
  fi
done
# gpt-oss shapes are written as the released files are (MXFP4 experts, Q8_0 elsewhere).
if [ ! -f "$models/gpt-oss-1b-mxfp4.gguf" ]; then
  "$venv/bin/python" scripts/make-bench-model.py --shape gpt-oss-1b --type q4_0 \
    --vocab-from "$models/SmolLM2-135M-Instruct.Q4_1.gguf" --out "$models/gpt-oss-1b-mxfp4.gguf"
fi
$axle bench doctor
status=0
for m in benchmarks/manifests/*.toml; do
  echo "== $m" >&2
  $axle bench scenario --manifest "$m" --output-root benchmarks/artifacts || status=1
done
$axle bench report benchmarks/artifacts/*.json --output benchmarks/reports --readme docs/*.md >/dev/null
exit $status
