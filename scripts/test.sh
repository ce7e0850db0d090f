#!/usr/bin/env bash
# The README's test command: set up (idempotent), then build and run every test of the workspace.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup.sh
cargo test --release --workspace
