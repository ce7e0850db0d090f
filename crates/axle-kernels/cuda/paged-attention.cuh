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
//      the KV head (GQA). A warp's lanes form groups of QL lanes (QL fixed by the head shape), each
//      lane holding a fixed slice of the head; a group scores one key at a time (a dot product per
//      lane, then a butterfly over the group's lanes) and keeps its own online softmax (max, sum,
//      accumulator) over keys at fixed offsets of each tile, in key order. The block merges the
//      groups in a fixed order. Keys and values reach shared memory through a pipeline of
//      asynchronous copies, a tile a stage, so loads of later tiles run while the warps compute;
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
// Pipeline stages of a block when the launch fills the card: on the H200, 3 and 4 stages read
// no faster (the warps' arithmetic, not the loads, sets the pace there).
#define AXLE_PA_STAGES 2
#define AXLE_PA_LOG2E 1.4426950408889634f

// The operands of one launch. Row r reads rows[2 r] (offset of its block table in `table`) and
// rows[2 r + 1] (end: keys visible; 0 = a row not computed here, its output is zero).
struct axle_pa_args {
    const char * q;        // F32 [head_dim, n_head, n_rows], element stride 4 bytes
    size_t q_nb1, q_nb2;   // bytes between query heads, between rows
    const char * k;        // cache, one slot per row of n_head_kv * head_dim: F16, or Q8_0
    const char * v;        //   (blocks of 32 values: an F16 scale, then 32 int8) where q8 is set
    int q8;
    size_t k_nb1, v_nb1;   // bytes between slots
    const int32_t * rows;  // [n_rows][2]
    const int32_t * table; // block ids
    const float * sinks;   // [n_head] extra logit per head, or null
    float * dst;           // F32 [head_dim, n_head, n_rows], contiguous
    float * part;          // scratch [n_rows][n_head][max_chunks][head_dim]
    float * part_ml;       // scratch [n_rows][n_head][max_chunks][2]: max (of base-2 scores), sum
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

// How a warp splits a head: each lane holds EL elements of a query, key, value and accumulator
// (as many registers for the G query heads of a group as the widest heads allow), so QL = D / EL
// lanes share one key and a warp works on KR = 32 / QL keys at once. Each group of QL lanes keeps
// its own online softmax over keys TG at a time; a warp covers T = KR * TG keys of a tile.
template <int D, int G> struct axle_pa_split {
    static constexpr int want = G <= 2 ? 16 : G <= 4 ? 8 : 4;      // EL from the registers of G heads
    static constexpr int EL = want < D / 32 ? D / 32 : want;      // at most 32 lanes a key
    static constexpr int U = EL < 8 ? EL : 8;                     // halves per load (8 or 16 bytes)
    static constexpr int QL = D / EL;                             // lanes a key
    static constexpr int KR = 32 / QL;                            // keys a warp scores at once
    static constexpr int TG = KR == 1 ? 8 : 4;                    // keys per softmax update
    static constexpr int T = KR * TG;                             // keys a warp takes from a tile
};

// How the cache stores a head: F16 values, or Q8_0 blocks (ggml's layout: 34 bytes of an F16
// scale and 32 int8 per 32 values, value = scale * int8, exact in float). A stage holds the
// cache's bytes as they are, copied in pieces of piece<D>() bytes: 16 for F16; for Q8_0 the
// widest of 16, 8 and 4 that divides a head's 34 * D / 32 bytes (heads are multiples of 64 wide;
// the glue checks the rows' stride for it).
struct axle_pa_f16 {
    static constexpr bool Q8 = false;
    template <int D> __host__ __device__ static constexpr int row() { return D * 2; }
    template <int D> __host__ __device__ static constexpr int piece() { return 16; }
};
struct axle_pa_q8 {
    static constexpr bool Q8 = true;
    template <int D> __host__ __device__ static constexpr int row() { return D / 32 * 34; }
    template <int D> __host__ __device__ static constexpr int piece() { return row<D>() % 16 == 0 ? 16 : row<D>() % 8 == 0 ? 8 : 4; }
};
static inline int axle_pa_q8_piece(int head_dim) {
    const int row = head_dim / 32 * 34;
    return row % 16 == 0 ? 16 : row % 8 == 0 ? 8 : 4;
}

// Loads U halves (U = 4 or 8: one 8 or 16-byte load) as floats.
template <int U>
__device__ __forceinline__ void axle_pa_load(const char * p, float * x) {
    if constexpr (U == 4) {
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

// U values of a head from element `e` on: for F16 the values, returning 1; for Q8_0 (U divides
// 32 and e is a multiple of U, so they lie in one block) the block's integers as floats,
// returning its scale. An integer q becomes a float as 2^23 + (q + 128), built from its byte
// (one byte permute), less 2^23 + 128: exact, and no int-to-float conversion.
template <typename KV, int U>
__device__ __forceinline__ float axle_pa_read(const char * head, int e, float * x) {
    if constexpr (!KV::Q8) {
        axle_pa_load<U>(head + e * (int) sizeof(half), x);
        return 1.0f;
    } else {
        const char * b = head + (e / 32) * 34;
        // The block's int8 lie 2 bytes in: 2-byte aligned, read in pairs.
        const unsigned short * qs = (const unsigned short *) (b + 2 + e % 32);
#pragma unroll
        for (int i = 0; i < U / 2; ++i) {
            const unsigned w = (unsigned) qs[i] ^ 0x8080u;
            x[2*i]     = __int_as_float((int) __byte_perm(w, 0x4B000000u, 0x7440)) - 8388736.0f;
            x[2*i + 1] = __int_as_float((int) __byte_perm(w, 0x4B000000u, 0x7441)) - 8388736.0f;
        }
        return __half2float(*(const half *) b);
    }
}

// Keys of one pipeline stage: T per warp, so warp w computes the same keys whatever the number
// of stages.
template <int D, int G, typename KV> struct axle_pa_tile {
    static constexpr int keys  = axle_pa_split<D, G>::T * AXLE_PA_WARPS;
    static constexpr int row   = KV::template row<D>();   // bytes of one head's key or value
    static constexpr int bytes = 2 * keys * row;          // keys, then values
};

// Bytes of shared memory a chunk block of S stages uses: the stages, reused for the key groups'
// accumulators when the block merges them.
template <int D, int G, typename KV, int S> constexpr int axle_pa_smem() {
    constexpr int stages = S * axle_pa_tile<D, G, KV>::bytes;
    constexpr int accs = AXLE_PA_WARPS * axle_pa_split<D, G>::KR * G * D * 4;
    return stages > accs ? stages : accs;
}

// One copy of N bytes (16, 8 or 4) from global to shared memory, asynchronous where the GPU has
// cp.async (sm_80 on); src_bytes 0 writes zeros.
template <int N>
__device__ __forceinline__ void axle_pa_copy(void * dst, const void * src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = (unsigned) __cvta_generic_to_shared(dst);
    if constexpr (N == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(src_bytes));
    } else if constexpr (N == 8) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(s), "l"(src), "r"(src_bytes));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src), "r"(src_bytes));
    }
#else
    if constexpr (N == 16) {
        *(uint4 *) dst = src_bytes ? *(const uint4 *) src : make_uint4(0, 0, 0, 0);
    } else if constexpr (N == 8) {
        *(uint2 *) dst = src_bytes ? *(const uint2 *) src : make_uint2(0, 0);
    } else {
        *(unsigned *) dst = src_bytes ? *(const unsigned *) src : 0u;
    }
#endif
}
__device__ __forceinline__ void axle_pa_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> __device__ __forceinline__ void axle_pa_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// S stages of keys and values are in flight while the warps compute: S changes how far the
// loads run ahead, never which keys a group of lanes sums or in what order.
template <int D, int G, typename KV, int S>
__global__ void __launch_bounds__(AXLE_PA_WARPS*32) axle_pa_chunk(const axle_pa_args a) {
    using split = axle_pa_split<D, G>;
    constexpr int EL = split::EL, U = split::U, QL = split::QL, KR = split::KR, TG = split::TG, T = split::T;
    constexpr int NT = AXLE_PA_WARPS * 32;
    constexpr int TILE = axle_pa_tile<D, G, KV>::keys, ROW = axle_pa_tile<D, G, KV>::row;
    constexpr int STAGE = axle_pa_tile<D, G, KV>::bytes;
    constexpr int PIECE = KV::template piece<D>();
    constexpr int PIECES = TILE * ROW / PIECE;  // copies of a stage's keys (as many of values)
    extern __shared__ __align__(16) char smem[];
    const int c = blockIdx.x, hk = blockIdx.y, r = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int kg = lane / QL, kl = lane % QL;  // the lane's key group in the warp, its place in it
    int table_off, begin, end;
    axle_pa_span(a, r, table_off, begin, end);
    // Chunks outside the row's keys are never read by the combine step.
    if (c * AXLE_PA_CHUNK >= end || (c + 1) * AXLE_PA_CHUNK <= begin) {
        return;
    }
    const int base = c * AXLE_PA_CHUNK;
    const int c0 = max(begin, base), c1 = min(end, base + AXLE_PA_CHUNK);
    // The cache slot of each of the chunk's keys (-1 outside the row's keys), read once.
    __shared__ int slots[AXLE_PA_CHUNK];
    for (int i = threadIdx.x; i < AXLE_PA_CHUNK; i += NT) {
        const int key = base + i;
        slots[i] = key >= c0 && key < c1 ? a.table[table_off + key / a.block_size] * a.block_size + key % a.block_size : -1;
    }
    __syncthreads();

    const int first = (c0 - base) / TILE, last = (c1 - 1 - base) / TILE;
    const char * kh = a.k + (size_t) hk * ROW;
    const char * vh = a.v + (size_t) hk * ROW;
    // Tile `t` into stage `st`: keys outside the row are zeros.
    auto load = [&](int t, int st) {
        char * dk = smem + st * STAGE;
#pragma unroll
        for (int i = threadIdx.x; i < PIECES; i += NT) {
            const int key = i / (ROW / PIECE), off = (i % (ROW / PIECE)) * PIECE;
            const int slot = slots[t * TILE + key];
            const bool in = slot >= 0;
            const int64_t s = in ? slot : 0;
            axle_pa_copy<PIECE>(dk + key * ROW + off, kh + s * a.k_nb1 + off, in ? PIECE : 0);
            axle_pa_copy<PIECE>(dk + TILE * ROW + key * ROW + off, vh + s * a.v_nb1 + off, in ? PIECE : 0);
        }
    };
#pragma unroll
    for (int i = 0; i < S - 1; ++i) {
        if (first + i <= last) load(first + i, i);
        axle_pa_commit();
    }

    // The lane's elements of a head: piece p covers [p * QL * U + kl * U, + U), so the QL lanes
    // of a key read it in contiguous 16-byte pieces.
    // Scores are kept in base 2 (the query carries the scale and log2(e) where there is no soft
    // cap), so each weight is one exp2.
    const float qscale = a.softcap == 0.0f ? a.scale * AXLE_PA_LOG2E : a.scale;
    float q[G][EL];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const float * qp = (const float *) (a.q + r * a.q_nb2 + (hk * G + g) * a.q_nb1);
#pragma unroll
        for (int p = 0; p < EL / U; ++p)
#pragma unroll
            for (int u = 0; u < U; ++u) q[g][p * U + u] = qp[p * QL * U + kl * U + u] * qscale;
    }
    float m[G], l[G], acc[G][EL];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = -INFINITY; l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < EL; ++e) acc[g][e] = 0.0f;
    }

    for (int t = first; t <= last; ++t) {
        if (t + S - 1 <= last) load(t + S - 1, (t + S - 1 - first) % S);
        axle_pa_commit();
        axle_pa_wait<S - 1>();
        __syncthreads();
        const int k0 = base + t * TILE + warp * T;  // the warp's first key; its group's are k0 + i * KR + kg
        if (k0 < c1 && k0 + T > c0) {
            const char * stage = smem + ((t - first) % S) * STAGE + warp * T * ROW;
            // Scores of the group's TG keys for each head; every lane of the group holds them.
            float s[TG][G];
#pragma unroll
            for (int i = 0; i < TG; ++i) {
                const int key = i * KR + kg;
                float kx[EL], kd[EL / U];
#pragma unroll
                for (int p = 0; p < EL / U; ++p) kd[p] = axle_pa_read<KV, U>(stage + key * ROW, p * QL * U + kl * U, kx + p * U);
                const bool ok = k0 + key >= c0 && k0 + key < c1;
#pragma unroll
                for (int g = 0; g < G; ++g) {
                    float d = 0.0f;
                    if constexpr (!KV::Q8) {
#pragma unroll
                        for (int e = 0; e < EL; ++e) d = fmaf(q[g][e], kx[e], d);
                    } else {
                        // Each piece's integers against the query, then times its block's scale.
#pragma unroll
                        for (int p = 0; p < EL / U; ++p) {
                            float part = 0.0f;
#pragma unroll
                            for (int u = 0; u < U; ++u) part = fmaf(q[g][p * U + u], kx[p * U + u], part);
                            d = fmaf(kd[p], part, d);
                        }
                    }
                    // A butterfly over the key's lanes: each of them ends with the same sum.
#pragma unroll
                    for (int off = QL / 2; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffff, d, off);
                    if (a.softcap != 0.0f) d = a.softcap * tanhf(d / a.softcap) * AXLE_PA_LOG2E;
                    s[i][g] = ok ? d : -INFINITY;
                }
            }
            // The group's online softmax, keys in order; a group whose keys are all outside the
            // row keeps its state (weights 0, no rescale).
#pragma unroll
            for (int g = 0; g < G; ++g) {
                float mx = m[g];
#pragma unroll
                for (int i = 0; i < TG; ++i) mx = fmaxf(mx, s[i][g]);
                const bool any = mx != -INFINITY;
                const float corr = any ? exp2f(m[g] - mx) : 1.0f;
                float sum = 0.0f;
#pragma unroll
                for (int i = 0; i < TG; ++i) { s[i][g] = any ? exp2f(s[i][g] - mx) : 0.0f; sum += s[i][g]; }
                l[g] = l[g] * corr + sum;
                m[g] = any ? mx : m[g];
#pragma unroll
                for (int e = 0; e < EL; ++e) acc[g][e] *= corr;
            }
#pragma unroll
            for (int i = 0; i < TG; ++i) {
                const int key = i * KR + kg;
                float vx[EL], vd[EL / U];
#pragma unroll
                for (int p = 0; p < EL / U; ++p) vd[p] = axle_pa_read<KV, U>(stage + TILE * ROW + key * ROW, p * QL * U + kl * U, vx + p * U);
#pragma unroll
                for (int g = 0; g < G; ++g)
#pragma unroll
                    for (int p = 0; p < EL / U; ++p) {
                        // The weight times the block's scale (1 for F16), then the piece's values.
                        const float w = !KV::Q8 ? s[i][g] : s[i][g] * vd[p];
#pragma unroll
                        for (int u = 0; u < U; ++u) acc[g][p * U + u] = fmaf(w, vx[p * U + u], acc[g][p * U + u]);
                    }
            }
        }
        __syncthreads();
    }
    axle_pa_wait<0>();
    __syncthreads();

    // Merge the key groups in (warp, group) order; the stages' memory holds their accumulators.
    constexpr int NG = AXLE_PA_WARPS * KR;
    __shared__ float sm[NG][G], sl[NG][G];
    float (*sacc)[G][D] = (float (*)[G][D]) smem;
    const int grp = warp * KR + kg;
#pragma unroll
    for (int g = 0; g < G; ++g) {
        if (kl == 0) { sm[grp][g] = m[g]; sl[grp][g] = l[g]; }
#pragma unroll
        for (int p = 0; p < EL / U; ++p)
#pragma unroll
            for (int u = 0; u < U; ++u) sacc[grp][g][p * QL * U + kl * U + u] = acc[g][p * U + u];
    }
    __syncthreads();
    const size_t part0 = ((size_t) r * a.n_head + (size_t) hk * G) * a.max_chunks + c;
    for (int i = threadIdx.x; i < G * D; i += NT) {
        const int g = i / D, d = i % D;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < NG; ++w) mx = fmaxf(mx, sm[w][g]);
        float sum = 0.0f, x = 0.0f;
        if (mx != -INFINITY) {
#pragma unroll
            for (int w = 0; w < NG; ++w) {
                const float f = exp2f(sm[w][g] - mx);
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
    const float sink = a.sinks ? a.sinks[h] * AXLE_PA_LOG2E : -INFINITY;  // the chunks' maxima are in base 2
    if (a.sinks) mx = fmaxf(mx, sink);
    float sum = 0.0f, x = 0.0f;
    for (int c = first; c <= last; ++c) {
        const float f = exp2f(a.part_ml[2*(base + c)] - mx);
        sum = fmaf(a.part_ml[2*(base + c) + 1], f, sum);
        x = fmaf(a.part[(base + c) * D + d], f, x);
    }
    if (a.sinks) sum += exp2f(sink - mx);
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

// Multiprocessors of the current device (cached per device).
static inline int axle_pa_sms() {
    static int sms[64] = {0};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 1;
    if (sms[dev] == 0) {
        int n = 0;
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
        sms[dev] = n > 0 ? n : 1;
    }
    return sms[dev];
}

template <int D, int G, typename KV, int S>
static void axle_pa_launch_dgs(const axle_pa_args & a, cudaStream_t stream) {
    constexpr int smem = axle_pa_smem<D, G, KV, S>();
    if constexpr (smem + 2 * 1024 > 48 * 1024) {
        // Above 48 KB (with the static arrays) a kernel must ask, once per device.
        static bool asked[64] = {false};
        int dev = 0;
        cudaGetDevice(&dev);
        if (dev >= 0 && dev < 64 && !asked[dev]) {
            cudaFuncSetAttribute(axle_pa_chunk<D, G, KV, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
            asked[dev] = true;
        }
    }
    const dim3 grid(a.max_chunks, a.n_head_kv, a.n_rows);
    axle_pa_chunk<D, G, KV, S><<<grid, AXLE_PA_WARPS*32, smem, stream>>>(a);
}

template <int D, int G, typename KV>
static void axle_pa_launch_dgk(const axle_pa_args & a, cudaStream_t stream) {
    // A launch of fewer blocks than the card has multiprocessors loads a whole chunk at once
    // (latency once per chunk); a full card keeps two stages a block, leaving room for more
    // blocks. The stages change no arithmetic.
    const long blocks = (long) a.max_chunks * a.n_head_kv * a.n_rows;
    if (blocks < axle_pa_sms()) {
        // At most 8 stages and 128 KB of them.
        constexpr int whole = AXLE_PA_CHUNK / axle_pa_tile<D, G, KV>::keys, fit = 128 * 1024 / axle_pa_tile<D, G, KV>::bytes;
        constexpr int most = whole < 8 ? whole : 8;
        axle_pa_launch_dgs<D, G, KV, most < fit ? most : fit>(a, stream);
    } else {
        axle_pa_launch_dgs<D, G, KV, AXLE_PA_STAGES>(a, stream);
    }
    axle_pa_combine<D><<<dim3(a.n_head, a.n_rows), D, 0, stream>>>(a);
}

template <int D, int G>
static void axle_pa_launch_dg(const axle_pa_args & a, cudaStream_t stream) {
    if (a.q8) {
        axle_pa_launch_dgk<D, G, axle_pa_q8>(a, stream);
    } else {
        axle_pa_launch_dgk<D, G, axle_pa_f16>(a, stream);
    }
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
