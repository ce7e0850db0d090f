#!/usr/bin/env bash
# The main job on the default model: set up, build, and answer one chat message with
# SmolLM2-135M-Instruct. Extra arguments go to `axle generate` (e.g. --max-tokens 64).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup.sh
models="$(./scripts/fetch-models.sh)"
cargo build --release --bin axle -q
exec ./target/release/axle generate --model "$models/SmolLM2-135M-Instruct.Q4_1.gguf" \
  --chat "${AXLE_DEMO_MESSAGE:-What are the three primary colors?}" --max-tokens 96 "$@"
