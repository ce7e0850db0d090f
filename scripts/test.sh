#!/usr/bin/env bash
# The README's test command: set up (idempotent), then build and run every test of the workspace.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup-tests.sh
# One test at a time: every engine keeps a spinning ggml thread pool, and on 2 cores parallel
# tests starve each other (minutes instead of seconds).
cargo test --release --workspace -- --test-threads=1
cargo build --release --bin axle
# The smoke scenario: a manifest exercising every check kind on a tiny fixture (under a minute).
./target/release/axle bench scenario --manifest benchmarks/manifests/smoke.toml --output-root target/bench-artifacts
# `axle serve` through the official openai Python client, and the delegated routes against real
# upstreams (axle serve, llama-cpp-python's server).
venv="${AXLE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/axle/venv}"
"$venv/bin/python" -m pytest -q tests/python
