// Axle's paged attention inside ggml's CUDA backend: crates/axle-kernels/cuda/apply.py copies this
// file and paged-attention.cuh into ggml-cuda/ (a compilation unit of its own) and hooks it into
// the backend's supports_op and compute_forward. It runs GGML_OP_CUSTOM nodes that carry Axle's
// mark, built by axle-ggml's `Context::paged_attention`; every other node is ggml's as before, so
// libllama and llama.cpp's tools built from that source are unchanged.
//
// Node: src[0] q F32 [head_dim, n_head, n_rows] (element-contiguous heads), src[1] k and src[2] v
// caches [n_head_kv * head_dim, slots], both F16 or both Q8_0, src[3] rows I32 [2, n_rows] (table offset, end),
// src[4] block table I32, src[5] sinks F32 [n_head] (optional). dst F32 [head_dim, n_head,
// n_rows], contiguous. op_params, after ggml's custom-op header: see AXLE_PA_P_*.
#include "common.cuh"
#include "paged-attention.cuh"

#define AXLE_PA_MARK 0x41584c33 // "AXL3"
enum {
    AXLE_PA_P_MARK    = 8,
    AXLE_PA_P_BLOCK   = 9,
    AXLE_PA_P_WINDOW  = 10,
    AXLE_PA_P_CHUNKS  = 11,
    AXLE_PA_P_SCALE   = 12,
    AXLE_PA_P_SOFTCAP = 13,
};

static bool axle_pa_node_ok(const ggml_tensor * op) {
    if (op->op != GGML_OP_CUSTOM || op->op_params[AXLE_PA_P_MARK] != AXLE_PA_MARK) {
        return false;
    }
    const ggml_tensor * q = op->src[0], * k = op->src[1], * v = op->src[2];
    const ggml_tensor * rows = op->src[3], * table = op->src[4], * sinks = op->src[5];
    if (!q || !k || !v || !rows || !table) {
        return false;
    }
    const int64_t head_dim = q->ne[0], n_head = q->ne[1];
    const bool q8 = k->type == GGML_TYPE_Q8_0;
    if (q->type != GGML_TYPE_F32 || (k->type != GGML_TYPE_F16 && !q8) || v->type != k->type ||
        rows->type != GGML_TYPE_I32 || table->type != GGML_TYPE_I32 || op->type != GGML_TYPE_F32 ||
        (sinks && (sinks->type != GGML_TYPE_F32 || sinks->ne[0] != n_head))) {
        return false;
    }
    if (head_dim <= 0 || k->ne[0] % head_dim != 0 || v->ne[0] != k->ne[0] || k->ne[1] != v->ne[1]) {
        return false;
    }
    const int64_t n_head_kv = k->ne[0] / head_dim;
    return n_head_kv > 0 && n_head % n_head_kv == 0 && axle_pa_supported((int) head_dim, (int) (n_head / n_head_kv)) &&
        q->nb[0] == 4 && q->nb[1] % 16 == 0 && q->nb[2] % 16 == 0 &&
        k->nb[0] == ggml_type_size(k->type) && v->nb[0] == ggml_type_size(v->type) &&
        k->nb[1] % (q8 ? axle_pa_q8_piece((int) head_dim) : 16) == 0 &&
        v->nb[1] % (q8 ? axle_pa_q8_piece((int) head_dim) : 16) == 0 &&
        ggml_is_contiguous(rows) && ggml_is_contiguous(table) &&
        rows->ne[0] == 2 && rows->ne[1] == q->ne[2] && ggml_is_contiguous(op) &&
        op->ne[0] == head_dim && op->ne[1] == n_head && op->ne[2] == q->ne[2] &&
        op->op_params[AXLE_PA_P_BLOCK] > 0 && op->op_params[AXLE_PA_P_CHUNKS] > 0;
}

bool ggml_cuda_axle_pa_supports_op(const ggml_tensor * op) {
    return axle_pa_node_ok(op);
}

bool ggml_cuda_axle_pa(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    if (!axle_pa_node_ok(dst)) {
        return false;
    }
    const ggml_tensor * q = dst->src[0], * k = dst->src[1], * v = dst->src[2];
    axle_pa_args a = {};
    a.q = (const char *) q->data;
    a.q_nb1 = q->nb[1];
    a.q_nb2 = q->nb[2];
    a.k = (const char *) k->data;
    a.v = (const char *) v->data;
    a.k_nb1 = k->nb[1];
    a.v_nb1 = v->nb[1];
    a.q8 = k->type == GGML_TYPE_Q8_0;
    a.rows = (const int32_t *) dst->src[3]->data;
    a.table = (const int32_t *) dst->src[4]->data;
    a.sinks = dst->src[5] ? (const float *) dst->src[5]->data : nullptr;
    a.dst = (float *) dst->data;
    a.head_dim = (int) q->ne[0];
    a.n_head = (int) q->ne[1];
    a.n_rows = (int) q->ne[2];
    a.n_head_kv = (int) (k->ne[0] / q->ne[0]);
    a.block_size = dst->op_params[AXLE_PA_P_BLOCK];
    a.window = dst->op_params[AXLE_PA_P_WINDOW];
    a.max_chunks = dst->op_params[AXLE_PA_P_CHUNKS];
    memcpy(&a.scale, &dst->op_params[AXLE_PA_P_SCALE], sizeof(float));
    memcpy(&a.softcap, &dst->op_params[AXLE_PA_P_SOFTCAP], sizeof(float));
    ggml_cuda_pool_alloc<float> scratch(ctx.pool(), axle_pa_scratch_floats(a));
    a.part = scratch.get();
    a.part_ml = a.part + (size_t) a.n_rows * a.n_head * a.max_chunks * a.head_dim;
    if (!axle_pa_launch(a, ctx.stream())) {
        return false;
    }
    CUDA_CHECK(cudaGetLastError());
    return true;
}

// Exported through the CUDA registry's get_proc_address as "axle_paged_attention".
extern "C" bool ggml_cuda_axle_pa_supports(int head_dim, int group) {
    return axle_pa_supported(head_dim, group);
}
