# Sourced by this folder's device runs (issue52.sh, issue52-after.sh): where things lie on the lent
# machine that `scripts/gpu-machine.sh start` prepared, and the environment Axle runs with there.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/scripts/gpu-trace"
w="${AXLE_GPU_WORK:-/root/axle-gpu}"
out="${OUT:?OUT}"
export AXLE_BACKENDS_DIR="$w/bin/backends" AXLE_GIT_COMMIT="$(cat "$root/.device/commit")"
m="$w/models/llama3-8b-q4_0.gguf"
tools="$w/bin/llama-tools"
axle="$w/bin/axle"
