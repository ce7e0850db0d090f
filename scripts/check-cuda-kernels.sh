#!/usr/bin/env bash
# Compiles Axle's CUDA kernels here, on a machine without a GPU or a CUDA install: nvcc and the
# headers come from NVIDIA's wheels on PyPI (about 500 MB, fetched once into the toolkit folder),
# the source is a copy of the vendored ggml with crates/axle-kernels/cuda/ applied, as scripts/build-backend.sh
# does on the GPU machine. A compile error found here costs no device time.
#
#   scripts/check-cuda-kernels.sh               compile ggml-cuda/mmvq.cu and mmq.cu (Axle's product
#                                               kernels are appended to them), paged-attention.cu
#                                               and its standalone test for sm_90; print ptxas's
#                                               registers and spills for each of Axle's kernels
#   scripts/check-cuda-kernels.sh --all         also ggml-cuda.cu, where the hooks are (minutes)
#   scripts/check-cuda-kernels.sh --sass NAME   also print the instruction mix of the loops of the
#                                               kernels whose mangled name contains NAME
#
# $AXLE_CUDA_TOOLKIT: where the toolkit goes (default .cache/cuda-toolkit, git-ignored).
# $AXLE_CUDA_ARCH: the target (default sm_90, the lent H100/H200).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tk="${AXLE_CUDA_TOOLKIT:-$root/.cache/cuda-toolkit}"
arch="${AXLE_CUDA_ARCH:-sm_90}"
sass=""
all=0
[ "${1:-}" = "--sass" ] && sass="${2:?--sass needs a kernel name}"
[ "${1:-}" = "--all" ] && all=1

if [ ! -x "$tk/nvidia/cu13/bin/nvcc" ]; then
  echo "fetching nvcc and CUDA headers from PyPI into $tk" >&2
  mkdir -p "$tk/wheels"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tk/wheels" \
    "nvidia-cuda-nvcc==13.*" "nvidia-cuda-crt==13.*" "nvidia-cuda-runtime==13.*" \
    "nvidia-cuda-cccl==13.*" "nvidia-nvvm==13.*" "nvidia-cublas==13.*" \
    "nvidia-cuda-cuobjdump==13.*" "nvidia-cuda-nvdisasm==13.*"
  # cuBLAS only for its headers (ggml's common.cuh includes them).
  python3 - "$tk" <<'EOF'
import pathlib, sys, zipfile
tk = pathlib.Path(sys.argv[1])
for whl in sorted((tk / "wheels").glob("*.whl")):
    with zipfile.ZipFile(whl) as z:
        for m in z.namelist():
            if m.startswith("nvidia/") and ("cublas" not in whl.name or "/include/" in m):
                z.extract(m, tk)
EOF
  chmod +x "$tk"/nvidia/cu13/bin/* "$tk"/nvidia/cu13/nvvm/bin/*
  rm -rf "$tk/wheels"
fi
export PATH="$tk/nvidia/cu13/bin:$PATH"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The vendored source, found and packed as scripts/build-backend.sh packs it for the GPU machine.
"$root/scripts/build-backend.sh" --pack "$work/src.tgz" >/dev/null
mkdir -p "$work/llama.cpp"
tar xzf "$work/src.tgz" -C "$work/llama.cpp" ./ggml
python3 "$root/crates/axle-kernels/cuda/apply.py" "$work/llama.cpp" >/dev/null
g="$work/llama.cpp/ggml"
status=0
units=(mmvq mmq paged-attention)
[ $all = 1 ] && units+=(ggml-cuda)
for f in "${units[@]}"; do
  echo "== nvcc $f.cu ($arch)"
  if ! nvcc -arch="$arch" -cubin -O3 -use_fast_math -extended-lambda -std=c++17 -DGGML_USE_CUDA -DNDEBUG \
      -I"$g/include" -I"$g/src" -I"$g/src/ggml-cuda" -Xptxas -v -o "$work/$f.cubin" \
      "$g/src/ggml-cuda/$f.cu" 2>"$work/$f.log"; then
    grep -v "^ptxas info" "$work/$f.log" >&2
    status=1
    continue
  fi
  # ptxas's lines come in threes per kernel: the name, its stack and spills, its registers.
  python3 - "$work/$f.log" <<'EOF'
import re, sys
name = None
for line in open(sys.argv[1]):
    m = re.search(r"Compiling entry function '(\w+)'", line)
    if m:
        name = m.group(1) if "axle" in m.group(1) else None
    elif name and "spill stores" in line:
        spills = re.search(r"(\d+) bytes spill stores", line).group(1)
    elif name and "Used" in line:
        regs = re.search(r"Used (\d+) registers", line).group(1)
        print(f"  {regs:>4} registers, {spills:>4} bytes spilled  {name}")
        name = None
EOF
  if [ -n "$sass" ]; then
    cuobjdump -sass "$work/$f.cubin" >"$work/$f.sass"
    python3 - "$sass" "$work/$f.sass" <<'EOF'
import collections, re, sys
want, fn, ins = sys.argv[1], None, {}
for line in open(sys.argv[2]):
    m = re.match(r"\s+Function : (\S+)", line)
    if m:
        fn = m.group(1) if want in m.group(1) else None
        if fn: ins[fn] = []
        continue
    m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
    if fn and m:
        ins[fn].append((int(m.group(1), 16), m.group(2).strip()))
for fn, body in ins.items():
    print(f"  {fn}: {len(body)} instructions")
    for addr, text in body:
        m = re.search(r"BRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            loop = [t for a, t in body if int(m.group(1), 16) <= a <= addr]
            ops = collections.Counter(t.split()[1 if t.startswith("@") else 0].split(".")[0] for t in loop)
            print(f"    loop {m.group(1)}-{hex(addr)}: {len(loop)} instructions; " +
                  ", ".join(f"{k} {v}" for k, v in ops.most_common(10)))
EOF
  fi
done
# The standalone test of paged attention (run on the GPU machine: scripts/gpu-machine.sh kernels).
echo "== nvcc paged-attention-test.cu ($arch)"
nvcc -arch="$arch" -O3 -use_fast_math -std=c++17 -o "$work/paged-attention-test" \
  "$root/crates/axle-kernels/cuda/paged-attention-test.cu" || status=1
exit $status
