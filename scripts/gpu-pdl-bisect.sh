#!/usr/bin/env bash
# Finds which of ggml's CUDA kernels breaks a model's exactness when it is launched with
# programmatic dependent launch (PDL, Hopper and newer; on by default in ggml, GGML_CUDA_PDL=0
# turns it off for every kernel). Runs on a GPU machine prepared by `scripts/gpu-machine.sh`.
#
#   scripts/gpu-pdl-bisect.sh OUT_DIR build          build a diagnostic CUDA backend (about 4
#                                                    minutes) whose PDL can be refused per kernel:
#                                                    GGML_CUDA_PDL_EXCLUDE=a,b (substrings of the
#                                                    kernels' mangled names), GGML_CUDA_PDL_LOG=1
#                                                    lists each kernel as it is first launched
#   scripts/gpu-pdl-bisect.sh OUT_DIR scan MODEL     device-check MODEL (a fixture name) once with
#                                                    each kernel it launches refused PDL, and says
#                                                    which refusals make it exact
#
# The diagnostic backend goes to $AXLE_GPU_WORK/bin/backends-pdl; the shipped one is untouched.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
w="${AXLE_GPU_WORK:-/root/axle-gpu}"
out="${1:?usage: $0 OUT_DIR build|scan MODEL}"
step="${2:?usage: $0 OUT_DIR build|scan MODEL}"
mkdir -p "$out" "$w/logs"
case "$step" in
  build)
    src="$w/llama-src-pdl"
    rm -rf "$src" && mkdir -p "$src" && tar xzf "$w/llama-src.tgz" -C "$src"
    python3 - "$src/ggml/src/ggml-cuda/common.cuh" <<'EOF'
import sys
p = sys.argv[1]
s = open(p).read()
old = "    const bool can_use_pdl = attr.ptxVersion >= 90;\n"
new = old.replace("const bool", "bool") + r'''
    {
        const char * name = nullptr;
        if (cudaFuncGetName(&name, kernel) != cudaSuccess || name == nullptr) {
            name = "?";
        }
        if (const char * ex = getenv("GGML_CUDA_PDL_EXCLUDE")) {
            std::string list(ex);
            size_t p = 0;
            while (p <= list.size()) {
                size_t q = list.find(',', p);
                if (q == std::string::npos) {
                    q = list.size();
                }
                const std::string tok = list.substr(p, q - p);
                if (!tok.empty() && strstr(name, tok.c_str()) != nullptr) {
                    can_use_pdl = false;
                }
                p = q + 1;
            }
        }
        if (getenv("GGML_CUDA_PDL_LOG")) {
            fprintf(stderr, "pdl-kernel %s %d\n", name, can_use_pdl ? 1 : 0);
        }
    }
'''
assert old in s
s = "#include <cstring>\n#include <string>\n" + s.replace(old, new, 1)
open(p, "w").write(s)
EOF
    AXLE_BACKEND_BUILD_DIR="$w/build-pdl" "$root/scripts/build-backend.sh" cuda --src "$src" \
      --out "$w/bin/backends-pdl" --arch 90-real >"$w/logs/build-pdl.log" 2>&1
    echo "build rc $?"; tail -n 2 "$w/logs/build-pdl.log"
    ;;
  scan)
    model="${3:?usage: $0 OUT_DIR scan MODEL}"
    f="$root/fixtures/$model.gguf"
    export AXLE_BACKENDS_DIR="$w/bin/backends-pdl"
    check() {
      "$w/bin/axle" bench device-check --model "$f" --device cuda0 --threads 8 \
        --output "$out/pdl-$model.json" 2>"$w/logs/pdl-$model.log" | grep -E "greedy|speculation"
    }
    echo "== every kernel with PDL"
    check
    GGML_CUDA_PDL_LOG=1 check >/dev/null
    grep -o 'pdl-kernel [^ ]* 1' "$w/logs/pdl-$model.log" | awk '{print $2}' | sort -u >"$out/pdl-kernels-$model.txt"
    echo "== $(wc -l <"$out/pdl-kernels-$model.txt") kernels launched with PDL"
    while read -r k; do
      r="$(GGML_CUDA_PDL_EXCLUDE="$k" check | tr '\n' ' ')"
      case "$r" in
        *"libllama (same device, flash attention on): 20/20"*"alone 20/20, batched 20/20; batched plain == alone plain 20/20"*)
          echo "FIXES: $k";;
        *) echo "no: $k";;
      esac
    done <"$out/pdl-kernels-$model.txt"
    ;;
  *)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
