#!/usr/bin/env bash
# Kept for old recipes: `scripts/build-backend.sh cuda` with the same options.
exec "$(dirname "${BASH_SOURCE[0]}")/build-backend.sh" cuda "$@"
