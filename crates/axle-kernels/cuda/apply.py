#!/usr/bin/env python3
"""Adds Axle's CUDA kernels to a copy of the vendored llama.cpp source before
scripts/build-backend.sh builds its CUDA backend: the column-invariant quantized products
(column-invariant-mmvq.cu), the replay of MMQ for a few columns (wide-replay-mmq.cu) and paged
attention (paged-attention.cu over paged-attention.cuh).

    crates/axle-kernels/cuda/apply.py LLAMA_CPP_DIR

Appends the two product kernels to ggml-cuda/mmvq.cu and mmq.cu (they use those files' static
tables) and copies paged attention in as a compilation unit of its own; declares them in
mmvq.cuh; calls the products first in ggml_cuda_mul_mat (only for products carrying Axle's hints)
and paged attention for GGML_OP_CUSTOM nodes carrying its mark (supports_op and compute_forward);
keeps replayed products out of ggml's mat-vec fusion, fuses a replayed product with the add after
it, and exports the capability queries through the CUDA registry's get_proc_address. Each edit is
anchored on a line of ggml's source; a missing anchor (another ggml) stops the build with an
error rather than building without the kernels. Applying twice is refused the same way.
"""
import pathlib
import sys

MARK = "Axle's column-invariant quantized products"


def edit(path: pathlib.Path, anchor: str, insert: str, after: bool = True) -> None:
    text = path.read_text()
    if text.count(anchor) != 1:
        sys.exit(f"error: {path.name}: expected one '{anchor.strip()[:60]}', found {text.count(anchor)}")
    at = text.index(anchor) + (len(anchor) if after else 0)
    path.write_text(text[:at] + insert + text[at:])


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: apply.py LLAMA_CPP_DIR")
    cuda = pathlib.Path(sys.argv[1]) / "ggml" / "src" / "ggml-cuda"
    mmvq = cuda / "mmvq.cu"
    if MARK in mmvq.read_text():
        sys.exit(f"error: {mmvq} already carries Axle's kernel")
    kernel = (pathlib.Path(__file__).parent / "column-invariant-mmvq.cu").read_text()
    mmvq.write_text(mmvq.read_text() + "\n" + kernel)
    header = cuda / "mmvq.cuh"
    header.write_text(
        header.read_text()
        + "\n// " + MARK + " (crates/axle-kernels/cuda/column-invariant-mmvq.cu in Axle).\n"
        + "bool ggml_cuda_axle_ci_mul_mat(ggml_backend_cuda_context & ctx, const ggml_tensor * src0,\n"
        + "    const ggml_tensor * src1, ggml_tensor * dst);\n"
        + 'extern "C" bool ggml_cuda_axle_ci_supports(ggml_type type);\n'
        + "bool ggml_cuda_axle_plain_product(const ggml_tensor * src0, const ggml_tensor * src1,\n"
        + "    const ggml_tensor * dst);\n"
        + "bool ggml_cuda_axle_pdl();\n"
        + "// Launches one of Axle's kernels, with ggml's programmatic dependent launch unless\n"
        + "// ggml_cuda_axle_pdl() says no.\n"
        + "template <typename Kernel, typename... Args>\n"
        + "static void axle_launch(Kernel kernel, const ggml_cuda_kernel_launch_params & params, Args &&... args) {\n"
        + "    if (ggml_cuda_axle_pdl()) {\n"
        + "        ggml_cuda_kernel_launch(kernel, params, std::forward<Args>(args)...);\n"
        + "        return;\n"
        + "    }\n"
        + "    kernel<<<params.block_nums, params.block_dims, params.shmem, params.stream>>>(std::forward<Args>(args)...);\n"
        + "    CUDA_CHECK(cudaGetLastError());\n"
        + "}\n"
        # The replay's declarations live here too, where ggml-cuda.cu sees them, so that a rebuild
        # after a change to the kernels does not recompile every file that includes mmq.cuh.
        + "\n// Axle's replay of MMQ for a few columns (crates/axle-kernels/cuda/wide-replay-mmq.cu in Axle).\n"
        + '#define AXLE_HINT_WIDE_REPLAY 0x41584c32 // "AXL2"\n'
        + "bool ggml_cuda_axle_wr_mul_mat(ggml_backend_cuda_context & ctx, const ggml_tensor * src0,\n"
        + "    const ggml_tensor * src1, ggml_tensor * dst);\n"
        + 'extern "C" bool ggml_cuda_axle_wr_supports(ggml_type type);\n'
        + "bool ggml_cuda_axle_wr_mul_mat_add(ggml_backend_cuda_context & ctx, const ggml_tensor * mm,\n"
        + "    const ggml_tensor * bias, ggml_tensor * out);\n"
    )
    header.write_text(
        header.read_text()
        + "\n// Axle's paged attention (paged-attention.cu, a compilation unit of its own).\n"
        + "bool ggml_cuda_axle_pa_supports_op(const ggml_tensor * op);\n"
        + "bool ggml_cuda_axle_pa(ggml_backend_cuda_context & ctx, ggml_tensor * dst);\n"
        + 'extern "C" bool ggml_cuda_axle_pa_supports(int head_dim, int group);\n'
    )
    here = pathlib.Path(__file__).parent
    for name in ("paged-attention.cu", "paged-attention.cuh"):
        (cuda / name).write_text((here / name).read_text())
    mmq = cuda / "mmq.cu"
    replay = (pathlib.Path(__file__).parent / "wide-replay-mmq.cu").read_text()
    mmq.write_text(mmq.read_text() + "\n" + replay)
    main_cu = cuda / "ggml-cuda.cu"
    edit(
        main_cu,
        "    if (ggml_cuda_op_mul_mat_use_fwht(dst) && ggml_cuda_op_fwht(ctx, src1, dst)) {\n"
        "        return;\n"
        "    }\n",
        "\n    // " + MARK + ": only for products carrying Axle's hint.\n"
        "    if (ggml_cuda_axle_ci_mul_mat(ctx, src0, src1, dst)) {\n"
        "        return;\n"
        "    }\n"
        "    if (ggml_cuda_axle_wr_mul_mat(ctx, src0, src1, dst)) {\n"
        "        return;\n"
        "    }\n",
    )
    # A one-column product followed by an add or a gated unit would be fused into ggml's mat-vec
    # kernel, past ggml_cuda_mul_mat: never for a product that asks for the replay of MMQ.
    edit(
        main_cu,
        "static bool ggml_cuda_should_fuse_mul_mat_vec_q(const ggml_tensor * tensor) {\n",
        "    if (tensor->op == GGML_OP_MUL_MAT && ggml_get_op_params_i32(tensor, 1) == AXLE_HINT_WIDE_REPLAY) {\n"
        "        return false; // Axle's replay of MMQ (wide-replay-mmq.cu) runs it\n"
        "    }\n",
    )
    # A replayed product followed by an add: one kernel, as ggml fuses its mat-vec kernel's.
    edit(
        main_cu,
        "        if (ggml_cuda_should_fuse_mul_mat_vec_f(mm_node)) {\n"
        "            ggml_cuda_mul_mat_vec_f(*cuda_ctx, src0, src1, ids, bias_node, &fusion_data);\n",
        "        if (op == GGML_OP_MUL_MAT && ggml_cuda_axle_wr_mul_mat_add(*cuda_ctx, mm_node, bias_tensor, bias_node)) {\n"
        "            fused_mul_mat_vec = true; // Axle's replay of MMQ, the add in its kernel\n"
        "            fused_node_count  = 2;\n"
        "            break;\n"
        "        }\n",
        after=False,
    )
    # Axle's paged attention: GGML_OP_CUSTOM nodes with its mark run on the device.
    edit(
        main_cu,
        "static bool ggml_cuda_compute_forward(ggml_backend_cuda_context & ctx, struct ggml_tensor * dst) {\n"
        "    switch (dst->op) {\n",
        "        case GGML_OP_CUSTOM:\n"
        "            if (!ggml_cuda_axle_pa(ctx, dst)) {\n"
        "                return false;\n"
        "            }\n"
        "            break;\n",
    )
    edit(
        main_cu,
        "    switch (op->op) {\n"
        "        case GGML_OP_UNARY:\n"
        "            switch (ggml_get_unary_op(op)) {\n"
        "                case GGML_UNARY_OP_ABS:\n",
        "    if (op->op == GGML_OP_CUSTOM) {\n"
        "        return ggml_cuda_axle_pa_supports_op(op); // Axle's paged attention, or nothing\n"
        "    }\n",
        after=False,
    )
    edit(
        main_cu,
        '    if (strcmp(name, "ggml_backend_get_features") == 0) {\n',
        '    if (strcmp(name, "axle_paged_attention") == 0) {\n'
        "        return (void *)ggml_cuda_axle_pa_supports;\n"
        "    }\n"
        '    if (strcmp(name, "axle_column_invariant_mmvq") == 0) {\n'
        "        return (void *)ggml_cuda_axle_ci_supports;\n"
        "    }\n"
        '    if (strcmp(name, "axle_wide_replay_mmq") == 0) {\n'
        "        return (void *)ggml_cuda_axle_wr_supports;\n"
        "    }\n",
        after=False,
    )
    print(f"applied Axle's column-invariant products and MMQ replay to {cuda}")


if __name__ == "__main__":
    main()
