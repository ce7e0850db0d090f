// Axle's paged attention for CUDA: one launch computes attention for every query row of a step,
// reading keys and values through each row's block table, with arithmetic that depends on the
// row alone.
//
// A row attends keys [begin, end) of its sequence (end: the row's position + 1; begin: 0, or
// end - window on sliding-window layers). Key j lives in cache slot
// table[table_off + j / block_size] * block_size + j % block_size. The keys are cut into chunks of
// AXLE_PA_CHUNK at absolute key indices (chunk c holds keys [c * CHUNK, (c + 1) * CHUNK)), so the
// chunks a row sees, and every sum inside them, depend only on its (begin, end) and its own query:
//   1. one thread block per (chunk, KV head, row) scores its keys for the query heads that share
//      the KV head (GQA), in groups of keys at fixed absolute offsets, warp w of W taking groups
//      w, w + W, ... (W fixed by the head shape); a warp keeps an online softmax (max, sum,
//      accumulator) in key order, and the block merges its warps in warp order;
//   2. one block per (query head, row) combines the row's chunks in chunk order.
// No quantity depends on the other rows of the launch, on how many there are, on where the
// blocks lie in the cache, or on the grid: a row gets the same bits alone, batched, as one of a
// sequence's verify rows, or recomputed after preemption.
//
// Plain CUDA (no ggml): the ggml backend's glue is paged-attention.cu; the standalone test and
// benchmark is paged-attention-test.cu.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define AXLE_PA_CHUNK 256 // keys per chunk: a constant, so a row's split depends on its position
// Warps of a chunk's block: at 140-150 registers a thread (Llama-3-8B heads), 4 warps leave room
// for 3 blocks an SM; 8 would leave 1.
#define AXLE_PA_WARPS 4
#define AXLE_PA_TABLE (AXLE_PA_CHUNK + 2) // block ids of one chunk, for blocks of any size

// The operands of one launch. Row r reads rows[2 r] (offset of its block table in `table`) and
// rows[2 r + 1] (end: keys visible; 0 = a row not computed here, its output is zero).
struct axle_pa_args {
    const char * q;        // F32 [head_dim, n_head, n_rows], element stride 4 bytes
    size_t q_nb1, q_nb2;   // bytes between query heads, between rows
    const char * k;        // F16 cache, one slot per row of n_head_kv * head_dim
    const char * v;
    size_t k_nb1, v_nb1;   // bytes between slots
    const int32_t * rows;  // [n_rows][2]
    const int32_t * table; // block ids
    const float * sinks;   // [n_head] extra logit per head, or null
    float * dst;           // F32 [head_dim, n_head, n_rows], contiguous
    float * part;          // scratch [n_rows][n_head][max_chunks][head_dim]
    float * part_ml;       // scratch [n_rows][n_head][max_chunks][2]: max, sum
    int head_dim, n_head, n_head_kv, n_rows;
    int block_size;
    int window;            // 0: none
    int max_chunks;        // chunks of the longest row: ceil(max end / CHUNK)
    float scale, softcap;  // softcap 0: none
};

__device__ __forceinline__ void axle_pa_span(const axle_pa_args & a, int r, int & table_off, int & begin, int & end) {
    table_off = a.rows[2*r];
    end       = a.rows[2*r + 1];
    begin     = a.window > 0 && end > a.window ? end - a.window : 0;
}

// Keys a warp scores together: enough loads in flight, registers for the widest heads.
template <int D> struct axle_pa_keys { static constexpr int n = D >= 256 ? 4 : 8; };

// Loads E halves of a key or value row (E = 2, 4 or 8: one 4, 8 or 16-byte load) as floats.
template <int E>
__device__ __forceinline__ void axle_pa_load(const char * p, float * x) {
    if constexpr (E == 2) {
        const float2 f = __half22float2(*(const half2 *) p);
        x[0] = f.x; x[1] = f.y;
    } else if constexpr (E == 4) {
        const uint2 u = *(const uint2 *) p;
        const half2 * h = (const half2 *) &u;
#pragma unroll
        for (int i = 0; i < 2; ++i) { const float2 f = __half22float2(h[i]); x[2*i] = f.x; x[2*i + 1] = f.y; }
    } else {
        const uint4 u = *(const uint4 *) p;
        const half2 * h = (const half2 *) &u;
#pragma unroll
        for (int i = 0; i < 4; ++i) { const float2 f = __half22float2(h[i]); x[2*i] = f.x; x[2*i + 1] = f.y; }
    }
}

template <int D, int G>
__global__ void __launch_bounds__(AXLE_PA_WARPS*32) axle_pa_chunk(const axle_pa_args a) {
    constexpr int E = D / 32;                // elements of a head a lane holds
    constexpr int T = axle_pa_keys<D>::n;    // keys per group
    constexpr int GROUPS = AXLE_PA_CHUNK / T;
    const int c = blockIdx.x, hk = blockIdx.y, r = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int table_off, begin, end;
    axle_pa_span(a, r, table_off, begin, end);
    // Chunks outside the row's keys are never read by the combine step.
    if (c * AXLE_PA_CHUNK >= end || (c + 1) * AXLE_PA_CHUNK <= begin) {
        return;
    }
    const int c0 = max(begin, c * AXLE_PA_CHUNK), c1 = min(end, (c + 1) * AXLE_PA_CHUNK);
    // The chunk's block ids, read once: slots then need no dependent load per key.
    __shared__ int blocks[AXLE_PA_TABLE];
    const int b0 = c0 / a.block_size, nb = (c1 - 1) / a.block_size - b0 + 1;
    for (int i = threadIdx.x; i < nb; i += AXLE_PA_WARPS * 32) {
        blocks[i] = a.table[table_off + b0 + i];
    }
    __syncthreads();

    float q[G][E];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const float * qp = (const float *) (a.q + r * a.q_nb2 + (hk * G + g) * a.q_nb1) + lane * E;
#pragma unroll
        for (int e = 0; e < E; ++e) q[g][e] = qp[e];
    }
    float m[G], l[G], acc[G][E];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = -INFINITY; l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[g][e] = 0.0f;
    }
    const size_t head_off = (size_t) hk * D * sizeof(half) + (size_t) lane * E * sizeof(half);

    for (int j = warp; j < GROUPS; j += AXLE_PA_WARPS) {
        const int k0 = c * AXLE_PA_CHUNK + j * T;
        if (k0 >= c1) break;
        if (k0 + T <= c0) continue;
        float kx[T][E], vx[T][E];
        bool ok[T];
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const int key = k0 + t;
            ok[t] = key >= c0 && key < c1;
            if (ok[t]) {
                const int64_t slot = (int64_t) blocks[key / a.block_size - b0] * a.block_size + key % a.block_size;
                axle_pa_load<E>(a.k + slot * a.k_nb1 + head_off, kx[t]);
                axle_pa_load<E>(a.v + slot * a.v_nb1 + head_off, vx[t]);
            } else {
#pragma unroll
                for (int e = 0; e < E; ++e) { kx[t][e] = 0.0f; vx[t][e] = 0.0f; }
            }
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float s[T];
#pragma unroll
            for (int t = 0; t < T; ++t) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < E; ++e) d = fmaf(q[g][e], kx[t][e], d);
                // A butterfly: every lane ends with the same sum (each pairwise add is commutative).
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffff, d, off);
                d *= a.scale;
                if (a.softcap != 0.0f) d = a.softcap * tanhf(d / a.softcap);
                s[t] = ok[t] ? d : -INFINITY;
            }
            float mx = m[g];
#pragma unroll
            for (int t = 0; t < T; ++t) mx = fmaxf(mx, s[t]);
            if (mx == -INFINITY) continue;
            const float corr = expf(m[g] - mx);
            float sum = 0.0f;
            float p[T];
#pragma unroll
            for (int t = 0; t < T; ++t) { p[t] = expf(s[t] - mx); sum += p[t]; }
            l[g] = l[g] * corr + sum;
            m[g] = mx;
#pragma unroll
            for (int e = 0; e < E; ++e) {
                float x = acc[g][e] * corr;
#pragma unroll
                for (int t = 0; t < T; ++t) x = fmaf(p[t], vx[t][e], x);
                acc[g][e] = x;
            }
        }
    }

    // Merge the warps in warp order.
    __shared__ float sm[AXLE_PA_WARPS][G], sl[AXLE_PA_WARPS][G];
    __shared__ float sacc[AXLE_PA_WARPS][G][D];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        if (lane == 0) { sm[warp][g] = m[g]; sl[warp][g] = l[g]; }
#pragma unroll
        for (int e = 0; e < E; ++e) sacc[warp][g][lane * E + e] = acc[g][e];
    }
    __syncthreads();
    const size_t part0 = ((size_t) r * a.n_head + (size_t) hk * G) * a.max_chunks + c;
    for (int i = threadIdx.x; i < G * D; i += AXLE_PA_WARPS * 32) {
        const int g = i / D, d = i % D;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < AXLE_PA_WARPS; ++w) mx = fmaxf(mx, sm[w][g]);
        float sum = 0.0f, x = 0.0f;
        if (mx != -INFINITY) {
#pragma unroll
            for (int w = 0; w < AXLE_PA_WARPS; ++w) {
                const float f = expf(sm[w][g] - mx);
                sum = fmaf(sl[w][g], f, sum);
                x = fmaf(sacc[w][g][d], f, x);
            }
        }
        const size_t at = part0 + (size_t) g * a.max_chunks;
        a.part[at * D + d] = x;
        if (d == 0) { a.part_ml[2*at] = mx; a.part_ml[2*at + 1] = sum; }
    }
}

// One block per (query head, row), one thread per element of the head: the row's chunks in
// chunk order, then the sink's logit.
template <int D>
__global__ void __launch_bounds__(D) axle_pa_combine(const axle_pa_args a) {
    const int h = blockIdx.x, r = blockIdx.y, d = threadIdx.x;
    int table_off, begin, end;
    axle_pa_span(a, r, table_off, begin, end);
    float * out = a.dst + ((size_t) r * a.n_head + h) * D + d;
    if (end <= begin) { *out = 0.0f; return; }
    const int first = begin / AXLE_PA_CHUNK, last = (end - 1) / AXLE_PA_CHUNK;
    const size_t base = ((size_t) r * a.n_head + h) * a.max_chunks;
    float mx = -INFINITY;
    for (int c = first; c <= last; ++c) mx = fmaxf(mx, a.part_ml[2*(base + c)]);
    if (a.sinks) mx = fmaxf(mx, a.sinks[h]);
    float sum = 0.0f, x = 0.0f;
    for (int c = first; c <= last; ++c) {
        const float f = expf(a.part_ml[2*(base + c)] - mx);
        sum = fmaf(a.part_ml[2*(base + c) + 1], f, sum);
        x = fmaf(a.part[(base + c) * D + d], f, x);
    }
    if (a.sinks) sum += expf(a.sinks[h] - mx);
    *out = sum > 0.0f ? x / sum : 0.0f;
}

// Whether a launch takes heads of `head_dim` with `group` query heads per KV head.
static inline bool axle_pa_supported(int head_dim, int group) {
    return (head_dim == 64 || head_dim == 128 || head_dim == 256) && group >= 1 && group <= 8;
}

// Scratch floats a launch needs (part and part_ml together; part_ml follows part).
static inline size_t axle_pa_scratch_floats(const axle_pa_args & a) {
    return (size_t) a.n_rows * a.n_head * a.max_chunks * (a.head_dim + 2);
}

template <int D, int G>
static void axle_pa_launch_dg(const axle_pa_args & a, cudaStream_t stream) {
    const dim3 grid(a.max_chunks, a.n_head_kv, a.n_rows);
    axle_pa_chunk<D, G><<<grid, AXLE_PA_WARPS*32, 0, stream>>>(a);
    axle_pa_combine<D><<<dim3(a.n_head, a.n_rows), D, 0, stream>>>(a);
}

template <int D>
static void axle_pa_launch_d(const axle_pa_args & a, cudaStream_t stream) {
    switch (a.n_head / a.n_head_kv) {
        case 1: axle_pa_launch_dg<D, 1>(a, stream); break;
        case 2: axle_pa_launch_dg<D, 2>(a, stream); break;
        case 3: axle_pa_launch_dg<D, 3>(a, stream); break;
        case 4: axle_pa_launch_dg<D, 4>(a, stream); break;
        case 5: axle_pa_launch_dg<D, 5>(a, stream); break;
        case 6: axle_pa_launch_dg<D, 6>(a, stream); break;
        case 7: axle_pa_launch_dg<D, 7>(a, stream); break;
        case 8: axle_pa_launch_dg<D, 8>(a, stream); break;
    }
}

// Launches both kernels on `stream`; `a.part` must hold axle_pa_scratch_floats(a) floats and
// `a.part_ml` point at part + n_rows * n_head * max_chunks * head_dim. False where the shape is
// not supported (nothing launched).
static inline bool axle_pa_launch(const axle_pa_args & a, cudaStream_t stream) {
    if (!axle_pa_supported(a.head_dim, a.n_head_kv > 0 ? a.n_head / a.n_head_kv : 0) ||
        a.n_head % a.n_head_kv != 0 || a.n_rows <= 0 || a.max_chunks <= 0 || a.block_size <= 0) {
        return false;
    }
    switch (a.head_dim) {
        case 64:  axle_pa_launch_d<64>(a, stream);  break;
        case 128: axle_pa_launch_d<128>(a, stream); break;
        case 256: axle_pa_launch_d<256>(a, stream); break;
    }
    return true;
}
