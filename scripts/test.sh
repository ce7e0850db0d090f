#!/usr/bin/env bash
# The README's test command: set up (idempotent), then build and run every test of the workspace.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup.sh
# One test at a time: every engine keeps a spinning ggml thread pool, and on 2 cores parallel
# tests starve each other (minutes instead of seconds).
cargo test --release --workspace -- --test-threads=1
