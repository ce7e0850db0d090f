#!/usr/bin/env bash
# The main job on the default model: set up, build, and answer one chat message with
# SmolLM2-135M-Instruct. Extra arguments go to `axle generate` (e.g. --temperature 0);
# AXLE_DEMO_MESSAGE and AXLE_DEMO_MAX_TOKENS set the message and the reply length.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup.sh
models="$(./scripts/fetch-models.sh)"
cargo build --release --bin axle -q
exec ./target/release/axle generate --model "$models/SmolLM2-135M-Instruct.Q4_1.gguf" \
  --chat "${AXLE_DEMO_MESSAGE:-What are the three primary colors?}" --max-tokens "${AXLE_DEMO_MAX_TOKENS:-96}" "$@"
