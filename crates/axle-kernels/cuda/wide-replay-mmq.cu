// Axle's replay of MMQ's arithmetic for products of a few columns, appended to ggml's
// ggml-cuda/mmq.cu by crates/axle-kernels/cuda/apply.py (so that it sees MMQ's configuration table and the
// quantizer MMQ uses), with a hook in ggml_cuda_mul_mat. Written for Axle; not part of ggml.
//
// What it is for. Axle's wide products (`--device-products wide`) multiply every small column
// through ggml's tiled MMQ kernel with all of an op's columns in one column tile, where a column
// gets the same bits in any op of 9 to 128 columns: MMQ splits the K range of each output tile
// across thread blocks (stream-k) by the weight's rows and the number of SMs alone. Below 9
// columns ggml takes its mat-vec kernel instead, so Axle padded such ops to 9 columns, and one
// sequence decoded at about half the mat-vec kernel's speed (MMQ's tiles are made for many
// columns). The kernels below compute exactly MMQ's numbers for 1 to 8 columns, reading the
// weights once.
//
// MMQ's arithmetic, for Q4_0 weights on its tensor-core path (Turing to Hopper, ggml's "ampere"
// configuration: tiles of I = 128 rows, K iterations of 256 weights, stream-k):
// - an output tile of rows [128*it, 128*it + 128) has the K range of blocks (of 32 weights)
//   [0, B); stream-k block b of G takes the blocks [kbc(b), kbc(b+1)) of the tiles laid end to
//   end, kbc(b) = b*ntiles*B/G rounded down to a multiple of 8 blocks within its tile;
//   G = ntiles where that fills at least 90% of the SMs' waves, else G = the SM count;
// - a block's stretch of a tile is one float sum per output, block by block in K order:
//   sum = fma(float(sumi)*d4, d8, sum), starting from 0, where sumi is the exact integer product
//   of the block's (q4 - 8) with the column's q8 values (int8 tensor cores; any order gives it),
//   d4 the weight block's scale and d8 the column block's (MMQ's own q8_1 quantization);
// - the stretch that reaches the tile's end is written to dst; the others go to a fixup buffer,
//   and a fixup kernel adds them, from the latest stretch back to the first, into one sum that
//   it adds to dst.
// Two kernels take the same stretches and sum each the same way:
// - one column: the rows kernel (axle_wr_rows_q4_0). A thread block takes a few rows of one tile
//   over the whole K range: it copies their weights to shared memory at once, computes the
//   integer products and float(sumi)*d4 there, runs one chain of fused multiply-adds per stretch
//   and adds the stretches in the fixup kernel's order. Nothing leaves the block but the result.
//   On an H100 it multiplies an 8B model's products at or above the mat-vec kernel's speed but
//   for the feed-forward down projection (25 us against 19).
// - 2 to 8 columns: the grid kernel (axle_wr_q4_0), MMQ's own grid (G blocks, each in 4 parts of
//   32 rows). Per slab of 32 weight blocks a block copies the weights and the columns' q8_1 blocks
//   to shared memory, computes float(sumi)*d4 there, and one thread per output runs the chain. A
//   stretch that is not a whole tile goes to a buffer; the last block to finish a tile (an atomic
//   count per tile and part of 32 rows) adds them in the fixup kernel's order and writes the tile.
// Q4_K and Q6_K weights take a kernel of their own (axle_wr_rows_k, below; for Q4_K rows too long
// for it, axle_wr_q4_K) for 1 to 8 columns (AXLE_WIDE_REPLAY_Q4K=0 and AXLE_WIDE_REPLAY_Q6K=0 turn
// them off; see ggml_cuda_axle_wr_supports): MMQ's arithmetic for those types is the same stream-k
// over tiles of 128 rows, with one weight block (256 weights) a K iteration; per 32 weights two
// fused multiply-adds for Q4_K, one (and one per 128 weights) for Q6_K.
// Axle asks for them per product with the mul_mat hint AXLE_HINT_WIDE_REPLAY (op_params[1]) and
// only where ggml_cuda_axle_wr_supports says yes. ggml's graph fusion of a one-column product
// with the next add or gated unit, which would run its mat-vec kernel, is turned off for such
// products; a product followed by an add is fused here instead (ggml_cuda_axle_wr_mul_mat_add:
// the add made where the result is written). `axle bench device-check` with wide products
// compares greedy tokens and log-probability bits (one sequence against a batch of 20, where the
// batch takes MMQ itself; speculation on against off) where it runs, and
// tests/python/test_wide_replay_order.py checks both kernels' fold order against ggml's on the
// CPU.

#include "cp-async.cuh"
#include "mmvq.cuh" // declarations and AXLE_HINT_WIDE_REPLAY ("AXL2"), where ggml-cuda.cu sees them too

#define AXLE_WR_TILE_ROWS 128                             // MMQ's I for Q4_0
#define AXLE_WR_ROWS 32                                   // rows per part of a tile
#define AXLE_WR_PARTS (AXLE_WR_TILE_ROWS/AXLE_WR_ROWS)
#define AXLE_WR_SLAB 32                                   // weight blocks per slab (a multiple of 8)
#define AXLE_WR_THREADS 256
#define AXLE_WR_ROWS_THREADS 128                          // threads of a rows kernel's block
#define AXLE_WR_MAX_K 131072                              // weights per row, at most
#define AXLE_WR_COUNTERS 65536                            // per device: tiles x parts, at most (Rust: ROWS_MAX)
#define AXLE_WR_ROW_BYTES (AXLE_WR_SLAB*18)               // one row's slab of Q4_0 blocks
#define AXLE_WR_COL_BYTES (AXLE_WR_SLAB/4*144)            // one column's slab of block_q8_1_mmq
#define AXLE_WR_T_STRIDE (AXLE_WR_SLAB + 1)               // floats per (column, row), padded

// Where stream-k block b's stretch starts, as mul_mat_q computes it for one column tile, one
// channel and one sample: b*T/G with T = ntiles*nblocks, rounded down to a multiple of 8 blocks
// within its tile. In 32-bit arithmetic from T = q*G + rem: b*T/G = b*q + b*rem/G (b*rem < G*G).
struct axle_wr_split {
    int nblocks; // weight blocks per row
    int G;       // stream-k blocks
    int q;       // T/G
    int rem;     // T%G
};

// per_iter: weight blocks per K iteration (8 for Q4_0; 1 for Q4_K, whose blocks are 256 weights).
template <int per_iter = MMQ_ITER_K/QK4_0>
static __device__ __forceinline__ int axle_wr_kbc(const int b, const axle_wr_split & sp) {
    int kbc = b*sp.q + b*sp.rem/sp.G;
    kbc -= (kbc % sp.nblocks) % per_iter;
    return kbc;
}

// The first stream-k block whose range reaches into tile it: from block it*G/ntiles, which starts
// at or before the tile's start, the first whose range ends past that start.
template <int per_iter = MMQ_ITER_K/QK4_0>
static __device__ __forceinline__ int axle_wr_first_block(const int it, const axle_wr_split & sp, const int ntiles) {
    int b = int(int64_t(it)*sp.G/ntiles);
    while (axle_wr_kbc<per_iter>(b + 1, sp) <= it*sp.nblocks) {
        ++b;
    }
    return b;
}

// The stream-k blocks whose ranges reach into tile it, from the first to the one that reaches its
// end: where each one's stretch starts in the tile (K order, in weight blocks), at most max_m of
// them; returns how many.
template <int per_iter = MMQ_ITER_K/QK4_0>
static __device__ int axle_wr_tile_stretches(
        const int it, const axle_wr_split & sp, const int ntiles, int * starts, const int max_m) {
    const int tile0 = it*sp.nblocks;
    const int tile1 = tile0 + sp.nblocks;
    int b = axle_wr_first_block<per_iter>(it, sp, ntiles);
    int m = 0;
    for (int k = axle_wr_kbc<per_iter>(b, sp); b < sp.G && m < max_m; ++b) {
        const int k_next = axle_wr_kbc<per_iter>(b + 1, sp);
        const int lo = max(k, tile0);
        if (min(k_next, tile1) > lo) {
            starts[m++] = lo - tile0;
        }
        if (k_next >= tile1) {
            break;
        }
        k = k_next;
    }
    return m;
}

// A row's result from its stretches' sums, stretch j's at t[scale*starts[j]], in the fixup
// kernel's order: the stretch that ends the tile plus the others from the latest back to the
// first; a tile of one stretch is that stretch.
static __device__ __forceinline__ float axle_wr_fold(const float * t, const int * starts, const int m, const int scale) {
    float out = t[scale*starts[m - 1]];
    if (m > 1) {
        float others = 0.0f;
        for (int j = m - 2; j >= 0; --j) {
            others += t[scale*starts[j]];
        }
        out = out + others;
    }
    return out;
}

// Where a kernel's results go: dst (+ bias), column-major, rows past nrows_x not written.
struct axle_wr_out {
    float * dst;
    const float * bias;
    int stride_col_dst;
    int stride_col_bias;
    int nrows_x;
};

// The rows kernels' last step, by every thread of the block: each (column, row)'s stretch sums,
// t[(c*R + r)*stride + scale*starts[j]], folded (axle_wr_fold) and written.
static __device__ __forceinline__ void axle_wr_fold_rows(
        const float * t, const int stride, const int scale, const int ncols, const int R, const int row0,
        const int * starts, const int m, const axle_wr_out o) {
    for (int w = threadIdx.x; w < ncols*R; w += AXLE_WR_ROWS_THREADS) {
        const int r = w % R;
        const int c = w / R;
        const int row = row0 + r;
        const float out = axle_wr_fold(t + (c*R + r)*stride, starts, m, scale);
        if (row < o.nrows_x) {
            o.dst[(int64_t) c*o.stride_col_dst + row] = o.bias ? out + o.bias[(int64_t) c*o.stride_col_bias + row] : out;
        }
    }
}

// Runs f(c, r, k0, k1) once for every (column, row, stretch) of a rows kernel's block, rows
// fastest (neighbouring threads on neighbouring rows, whose values are a padded stride apart: no
// bank conflicts): stretch j is the weight blocks [starts[j], starts[j + 1]), the last one up to
// `nblocks`.
template <typename F>
static __device__ __forceinline__ void axle_wr_each_chain(
        const int ncols, const int R, const int * starts, const int m, const int nblocks, const F & f) {
    for (int w = threadIdx.x; w < ncols*R*m; w += AXLE_WR_ROWS_THREADS) {
        const int r = w % R;
        const int j = (w / R) % m;
        const int c = w / (R*m);
        f(c, r, starts[j], j + 1 < m ? starts[j + 1] : nblocks);
    }
}

template <int ncols>
static constexpr __host__ __device__ int axle_wr_shared_bytes() {
    return AXLE_WR_ROWS*AXLE_WR_ROW_BYTES + ncols*AXLE_WR_COL_BYTES + ncols*AXLE_WR_ROWS*AXLE_WR_T_STRIDE*4;
}

// grid (G, 4): stream-k block b's stretches for 32 rows of each tile they touch. `partials`:
// [G][2][ncols][128], a block's stretch that starts inside a tile in slot 0, one that starts at a
// tile's start and ends inside it in slot 1; `counters`: per tile and part, zero between ops.
// At most 64 registers: 4 blocks an SM, so that the grid of 4 x (SM count) blocks runs in one
// wave (3 an SM, with 66 registers, took half as long again).
template <int ncols>
__launch_bounds__(AXLE_WR_THREADS, 4)
static __global__ void axle_wr_q4_0(
        const char * __restrict__ vx, const char * __restrict__ vy, float * dst, const float * bias,
        const int stride_col_bias, float * partials, int * counters, const axle_wr_split sp, const int nrows_x,
        const int stride_row_x, const int ncols_y, const int stride_col_dst, const int ntiles) {
    ggml_cuda_pdl_lc(); // programmatic dependent launch, as in column-invariant-mmvq.cu
    ggml_cuda_pdl_sync();
    extern __shared__ __align__(16) char axle_wr_smem[];
    char * sx = axle_wr_smem;                                    // [row][slab block] raw Q4_0
    char * sy = sx + AXLE_WR_ROWS*AXLE_WR_ROW_BYTES;             // [column][slab] raw block_q8_1_mmq
    float * st = (float *) (sy + ncols*AXLE_WR_COL_BYTES);       // [column][row][block] sumi*d4
    __shared__ bool folds;
    __shared__ int fold_first; // the tile's first block with data
    __shared__ int fold_last;  // the block whose stretch ends the tile
    const int tid = threadIdx.x;
    const int nblocks = sp.nblocks;
    const int G = sp.G;
    const int b = blockIdx.x;
    const int part = blockIdx.y;
    // Chain threads: row r of the 32, column c.
    const int r = tid % AXLE_WR_ROWS;
    const int c = tid / AXLE_WR_ROWS;
    // Where block bb keeps its stretch of tile it.
    auto partial = [&](const int bb, const int it) -> float * {
        const int slot = axle_wr_kbc(bb, sp) > it*nblocks ? 0 : 1;
        return partials + (((int64_t) bb*2 + slot)*ncols + c)*AXLE_WR_TILE_ROWS + AXLE_WR_ROWS*part + r;
    };

    int kbc = axle_wr_kbc(b, sp);
    const int kbc_stop = axle_wr_kbc(b + 1, sp);
    while (kbc < kbc_stop) {
        const int it = kbc / nblocks;
        const int k0 = kbc % nblocks;
        const int k1 = min(nblocks, k0 + kbc_stop - kbc);
        const int row0 = AXLE_WR_TILE_ROWS*it + AXLE_WR_ROWS*part;
        float sum = 0.0f;
        for (int s = k0; s < k1; s += AXLE_WR_SLAB) {
            const int nb = min(AXLE_WR_SLAB, k1 - s); // a multiple of 8: 16-byte pieces
            const int row_pieces = nb*18/16;
            for (int k = tid; k < AXLE_WR_ROWS*row_pieces; k += AXLE_WR_THREADS) {
                const int rr = k / row_pieces;
                const int64_t row = min(row0 + rr, nrows_x - 1);
                const int p = k % row_pieces;
                *(int4 *) (sx + rr*AXLE_WR_ROW_BYTES + 16*p) =
                    *(const int4 *) (vx + (row*stride_row_x + s)*18 + 16*p);
            }
            const int col_pieces = nb/4*9;
            for (int k = tid; k < ncols*col_pieces; k += AXLE_WR_THREADS) {
                const int cc = k / col_pieces;
                const int p = k % col_pieces;
                *(int4 *) (sy + cc*AXLE_WR_COL_BYTES + 16*p) =
                    *(const int4 *) (vy + ((int64_t) (s/4 + p/9)*ncols_y + cc)*144 + 16*(p % 9));
            }
            __syncthreads();

            // Integer products and float(sumi)*d4, a (row, block) pair per thread at a time.
            for (int k = tid; k < AXLE_WR_ROWS*nb; k += AXLE_WR_THREADS) {
                const int rr = k / nb;
                const int bl = k % nb;
                const char * bx = sx + rr*AXLE_WR_ROW_BYTES + bl*18;
                const float d4 = __half2float(*(const half *) bx);
                int lo[4];
                int hi[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int q = get_int_b2(bx + 2, j);
                    lo[j] = __vsub4((q >> 0) & 0x0F0F0F0F, 0x08080808);
                    hi[j] = __vsub4((q >> 4) & 0x0F0F0F0F, 0x08080808);
                }
#pragma unroll
                for (int cc = 0; cc < ncols; ++cc) {
                    const int * yq = (const int *) (sy + cc*AXLE_WR_COL_BYTES + (bl/4)*144 + 16 + (bl%4)*32);
                    int sumi = 0;
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        sumi = ggml_cuda_dp4a(lo[j], yq[j], sumi);
                        sumi = ggml_cuda_dp4a(hi[j], yq[j + 4], sumi);
                    }
                    st[(cc*AXLE_WR_ROWS + rr)*AXLE_WR_T_STRIDE + bl] = (float) sumi * d4;
                }
            }
            __syncthreads();

            // The chain, in K order: MMQ's sum += sumi*d4*d8 (FMUL, then FFMA).
            if (c < ncols) {
                const float * t = st + (c*AXLE_WR_ROWS + r)*AXLE_WR_T_STRIDE;
                const half2 * ds = (const half2 *) (sy + c*AXLE_WR_COL_BYTES);
                for (int bl = 0; bl < nb; ++bl) {
                    const float d8 = __low2float(ds[(bl/4)*36 + bl%4]);
                    sum += t[bl]*d8;
                }
            }
            __syncthreads(); // the slab buffers are refilled next
        }
        const int row = row0 + r;
        if (k0 == 0 && k1 == nblocks) { // a whole tile
            if (c < ncols && row < nrows_x) {
                dst[(int64_t) c*stride_col_dst + row] = bias ? sum + bias[(int64_t) c*stride_col_bias + row] : sum;
            }
        } else {
            if (c < ncols) {
                *partial(b, it) = sum;
            }
            __threadfence();
            __syncthreads();
            if (tid == 0) {
                // The tile's stretches: the blocks from the first whose range reaches into it to
                // the one whose range reaches its end, those with data.
                const int first = axle_wr_first_block(it, sp, ntiles);
                int n = 0;
                int last = first;
                for (int bb = first, kb = axle_wr_kbc(first, sp); bb < G && kb < (it + 1)*nblocks; ++bb) {
                    const int kb_next = axle_wr_kbc(bb + 1, sp);
                    if (kb_next > kb) {
                        ++n;
                        last = bb;
                    }
                    kb = kb_next;
                }
                fold_first = first;
                fold_last = last;
                int * counter = counters + it*AXLE_WR_PARTS + part;
                folds = atomicAdd(counter, 1) == n - 1;
                if (folds) {
                    *counter = 0; // for the next op
                }
            }
            __syncthreads();
            if (folds && c < ncols) {
                __threadfence();
                // The fixup kernel's order: the stretch that ends the tile, plus the sum of the
                // others from the latest back to the first (blocks without data skipped).
                float others = 0.0f;
                int kb_next = axle_wr_kbc(fold_last, sp);
                for (int bb = fold_last - 1; bb >= fold_first; --bb) {
                    const int kb = axle_wr_kbc(bb, sp);
                    if (kb < kb_next) {
                        others += __ldcg(partial(bb, it));
                    }
                    kb_next = kb;
                }
                if (row < nrows_x) {
                    const float out = __ldcg(partial(fold_last, it)) + others;
                    dst[(int64_t) c*stride_col_dst + row] = bias ? out + bias[(int64_t) c*stride_col_bias + row] : out;
                }
            }
        }
        kbc += nblocks - k0; // the next tile's start
    }
}

// The rows kernel: a thread block takes R rows of one tile (R divides 128) over the whole K range,
// so that it needs no partial sums in global memory, no counters and no second pass.
// 0. Its weights, R rows of the whole K range, are copied to shared memory at once (coalesced
//    asynchronous 16-byte copies, every one in flight together).
// 1. Integer products: a thread takes a row's 8 weight blocks of a K iteration at a time, rows
//    fastest (so that a warp's threads read the same column blocks) and computes float(sumi)*d4
//    per column into shared memory; each column's d8 goes beside them.
// 2. The chains: one thread per (column, row, stretch) runs the stretch's fused multiply-adds in
//    K order (MMQ's sum += sumi*d4*d8 from 0) and leaves the sum at the stretch's first place.
// 3. The fold: one thread per (column, row) adds the stretches in the fix-up kernel's order.
// The stretches of the tile are those of MMQ's stream-k blocks (axle_wr_kbc), found once per
// thread block while the copies are in flight. The launcher picks R to fit shared memory
// (axle_wr_rows_for).
#define AXLE_WR_ROWS_MAX_BYTES (96*1024)                  // shared memory of a block, at most

// A row's weights in shared memory, padded by 16 bytes so that the rows' 16-byte reads of one
// warp fall in different banks.
static constexpr __host__ __device__ int axle_wr_rows_stage_stride(const int nblocks) {
    return nblocks*18 + 16;
}

static constexpr __host__ __device__ size_t axle_wr_rows_shared_bytes(const int ncols, const int R, const int nblocks) {
    return (size_t) R*axle_wr_rows_stage_stride(nblocks) +
        ((size_t) ncols*R*(nblocks + 1) + (size_t) ncols*nblocks + nblocks/8 + 1)*4;
}

// One column (all it is launched for): at most 64 registers, 8 blocks an SM.
template <int ncols>
__launch_bounds__(AXLE_WR_ROWS_THREADS, 8)
static __global__ void axle_wr_rows_q4_0(
        const char * __restrict__ vx, const char * __restrict__ vy, float * dst, const float * bias,
        const int stride_col_bias, const axle_wr_split sp, const int R, const int nrows_x, const int stride_row_x,
        const int ncols_y, const int stride_col_dst, const int ntiles) {
    ggml_cuda_pdl_lc(); // programmatic dependent launch, as in column-invariant-mmvq.cu
    ggml_cuda_pdl_sync();
    extern __shared__ __align__(16) char axle_wr_rows_smem[];
    const int nblocks = sp.nblocks;
    const int stage_stride = axle_wr_rows_stage_stride(nblocks);
    const int stride = nblocks + 1;                                    // floats per (column, row), padded
    char * stage = axle_wr_rows_smem;                                  // [row] raw Q4_0 blocks
    float * st = (float *) (stage + R*stage_stride);                   // [column][row][block] sumi*d4
    float * d8s = st + ncols*R*stride;                                 // [column][block] d8
    int * starts = (int *) (d8s + ncols*nblocks);                      // the tile's stretches, K order
    __shared__ int nstretches;
    const int tid = threadIdx.x;
    const int row0 = blockIdx.x*R;
    const int it = row0/AXLE_WR_TILE_ROWS;

    // 0. The weights (past the last row: the last row again).
    const int row_pieces = nblocks*18/16;
    for (int k = tid; k < R*row_pieces; k += AXLE_WR_ROWS_THREADS) {
        const int r = k / row_pieces;
        const int p = k - r*row_pieces;
        const int64_t row = min(row0 + r, nrows_x - 1);
        cp_async_cg_16<0>(ggml_cuda_cvta_generic_to_shared(stage + r*stage_stride + 16*p),
            vx + row*stride_row_x*18 + 16*p);
    }

    if (tid == 0) {
        nstretches = axle_wr_tile_stretches(it, sp, ntiles, starts, nblocks/8 + 1);
    }

    cp_async_wait_all();
    __syncthreads();

    // 1. Integer products.
    for (int w = tid; w < R*(nblocks/8); w += AXLE_WR_ROWS_THREADS) {
        const int r = w % R;
        const int g = w / R;
        const int4 * src = (const int4 *) (stage + r*stage_stride + 144*g);
        int x[36];
#pragma unroll
        for (int i = 0; i < 9; ++i) {
            const int4 v = src[i];
            x[4*i + 0] = v.x;
            x[4*i + 1] = v.y;
            x[4*i + 2] = v.z;
            x[4*i + 3] = v.w;
        }
#pragma unroll
        for (int b = 0; b < 8; ++b) {
            // Block b's bytes start at 18*b: its scale, then 16 bytes of quants.
            const int at = 18*b;
            const unsigned d_bits = at % 4 == 0 ? x[at/4] & 0xFFFF : (unsigned) x[at/4] >> 16;
            const float d4 = __half2float(__ushort_as_half((unsigned short) d_bits));
            int lo[4];
            int hi[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int q0 = at + 2 + 4*j;
                const int q = q0 % 4 == 0 ? x[q0/4] : __funnelshift_r(x[q0/4], x[q0/4 + 1], 16);
                lo[j] = __vsub4((q >> 0) & 0x0F0F0F0F, 0x08080808);
                hi[j] = __vsub4((q >> 4) & 0x0F0F0F0F, 0x08080808);
            }
            const int bl = 8*g + b;
#pragma unroll
            for (int c = 0; c < ncols; ++c) {
                const char * yb = vy + ((int64_t) (bl/4)*ncols_y + c)*144;
                const int4 * y = (const int4 *) (yb + 16 + (bl%4)*32);
                const int4 ylo = y[0];
                const int4 yhi = y[1];
                int sumi = 0;
                sumi = ggml_cuda_dp4a(lo[0], ylo.x, sumi);
                sumi = ggml_cuda_dp4a(hi[0], yhi.x, sumi);
                sumi = ggml_cuda_dp4a(lo[1], ylo.y, sumi);
                sumi = ggml_cuda_dp4a(hi[1], yhi.y, sumi);
                sumi = ggml_cuda_dp4a(lo[2], ylo.z, sumi);
                sumi = ggml_cuda_dp4a(hi[2], yhi.z, sumi);
                sumi = ggml_cuda_dp4a(lo[3], ylo.w, sumi);
                sumi = ggml_cuda_dp4a(hi[3], yhi.w, sumi);
                st[(c*R + r)*stride + bl] = (float) sumi * d4;
                if (r == 0) {
                    d8s[c*nblocks + bl] = __low2float(*(const half2 *) (yb + (bl%4)*4));
                }
            }
        }
    }
    __syncthreads();

    // 2. The chains.
    const int m = nstretches;
    axle_wr_each_chain(ncols, R, starts, m, nblocks, [&](const int c, const int r, const int k0, const int k1) {
        float * t = st + (c*R + r)*stride;
        const float * d8 = d8s + c*nblocks;
        float sum = 0.0f;
        for (int bl = k0; bl < k1; ++bl) {
            sum += t[bl]*d8[bl];
        }
        t[k0] = sum; // only this thread reads or writes [k0, k1) of this row
    });
    __syncthreads();

    // 3. The fold.
    axle_wr_fold_rows(st, stride, 1, ncols, R, row0, starts, m, {dst, bias, stride_col_dst, stride_col_bias, nrows_x});
}

// Rows a block of a rows kernel takes: the fewest, a power of two up to 32 (a block stays in one
// tile), that give each thread one of a row's `units` (`forced` rows instead where positive), then
// halved until `bytes(R)` fits the block's shared memory; 0 where one row does not fit.
template <typename Bytes>
static int axle_wr_rows_pick(const int units, const int forced, const Bytes & bytes) {
    int R = 1;
    while (R < 32 && (forced > 0 ? R < forced : R*units < AXLE_WR_ROWS_THREADS)) {
        R *= 2;
    }
    while (R > 0 && bytes(R) > AXLE_WR_ROWS_MAX_BYTES) {
        R /= 2;
    }
    return R;
}

// Rows a thread block of the rows kernel takes: the fewest, a power of two up to 32 (a block stays
// in one tile), that give each thread a K iteration of a row (8 blocks), fewer where shared memory
// asks; 0 where one row does not fit (the grid kernel takes the op). A wave model over each size's
// occupancy picked other sizes (2 rows for the 8B down projection, 4 for attention output) at the
// same speed or slower, and 1 to 8 rows everywhere gave the down projection 25-28 us (the mat-vec
// kernel: 19). AXLE_WR_ROWS overrides it (measurements): R rows, or 0 for the grid kernel.
static int axle_wr_rows_for(const int ncols, const int nblocks) {
    static const int forced = [] {
        const char * env = getenv("AXLE_WR_ROWS");
        return env != nullptr ? atoi(env) : -1;
    }();
    if (forced == 0) {
        return 0;
    }
    return axle_wr_rows_pick(nblocks/8, forced, [&](const int R) { return axle_wr_rows_shared_bytes(ncols, R, nblocks); });
}

// A Q4_K block as MMQ's tile loader (ggml_cuda_mmq_load_tiles_q4_K) holds it, the same
// expressions: each sub-block's (d*sc, -dmin*m), half products.
static __device__ __forceinline__ void axle_wr_q4_K_scales(const block_q4_K * bx, half2 * dms) {
    const int * scales = (const int *) bx->scales;
    const int sc32[2] = {unpack_scales_q45_K(scales, 0), unpack_scales_q45_K(scales, 1)};
    const int  m32[2] = {unpack_scales_q45_K(scales, 2), unpack_scales_q45_K(scales, 3)};
    const half2 dm = bx->dm * make_half2(1.0f, -1.0f);
#pragma unroll
    for (int s = 0; s < 8; ++s) {
        const uint8_t * sc8 = (const uint8_t *) &sc32[s/4];
        const uint8_t *  m8 = (const uint8_t *) &m32[s/4];
        dms[s] = dm*make_half2(sc8[s % 4], m8[s % 4]);
    }
}

// Sub-block s's 32 weights as 8 ints of 4 unsigned nibbles each, in K order.
static __device__ __forceinline__ void axle_wr_q4_K_nibbles(const block_q4_K * bx, const int s, int * v) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        v[i] = (get_int_b4(bx->qs, 8*(s/2) + i) >> (4*(s % 2))) & 0x0F0F0F0F;
    }
}

// The Q4_K replay, 1 to 8 columns. MMQ's arithmetic for Q4_K on the same path (I = 128 rows a
// tile, K iterations of one 256-weight block, stream-k; docs/notes/mmq-q4k-arithmetic.md):
// - the weight tile holds each 32-weight sub-block s of a block as its nibbles (0..15, no offset)
//   and a half2 (d*sc_s, -dmin*m_s), each a half product of (d, -dmin) and (sc_s, m_s);
// - the columns are MMQ's q8_1 (the DS4 layout: per 32 values a half2 of the scale and the sum
//   of the values before quantization);
// - per output, a stretch's sum starts at 0 and takes, block by block and sub-block by sub-block
//   in K order, sum += dA*dB*C and then sum += mA*sB, with C the exact integer product of the
//   sub-block's nibbles and the column's q8 values (an int8 tensor-core product of k = 32);
// - the stretches of a tile are folded as for Q4_0 (the one that ends the tile, plus the others
//   from the latest back to the first).
// A thread takes one row and every column: it walks its row's stretches from the last back to the
// first, each from 0, so that the fold needs no stored partial sums. Rows of a block share a
// tile (AXLE_WR_K_THREADS divides 128). Little parallelism (one thread a row: 12 ms a step for a
// lone sequence of the 8B file, against 5 ms with the rows kernel below), so it only takes rows
// too long for the rows kernel's shared memory.
#define AXLE_WR_K_THREADS 64
#define AXLE_WR_K_MAX_STRETCHES 256 // stream-k blocks reaching into one tile, at most (G <= SMs)

template <int ncols>
__launch_bounds__(AXLE_WR_K_THREADS)
static __global__ void axle_wr_q4_K(
        const char * __restrict__ vx, const char * __restrict__ vy, float * dst, const float * bias,
        const int stride_col_bias, const axle_wr_split sp, const int nrows_x, const int stride_row_x,
        const int ncols_y, const int stride_col_dst, const int ntiles) {
    ggml_cuda_pdl_lc(); // programmatic dependent launch, as in column-invariant-mmvq.cu
    ggml_cuda_pdl_sync();
    __shared__ int starts[AXLE_WR_K_MAX_STRETCHES]; // the tile's stretches, K order
    __shared__ int nstretches;
    const int nblocks = sp.nblocks;
    const int row0 = blockIdx.x*AXLE_WR_K_THREADS;
    const int it = row0/AXLE_WR_TILE_ROWS;
    if (threadIdx.x == 0) {
        nstretches = axle_wr_tile_stretches<1>(it, sp, ntiles, starts, AXLE_WR_K_MAX_STRETCHES);
    }
    __syncthreads();
    const int row = row0 + threadIdx.x;
    const block_q4_K * x = (const block_q4_K *) vx + (int64_t) min(row, nrows_x - 1)*stride_row_x;
    const int m = nstretches;
    float out[ncols];
    float others[ncols];
#pragma unroll
    for (int c = 0; c < ncols; ++c) {
        others[c] = 0.0f;
    }
    for (int j = m - 1; j >= 0; --j) {
        const int k0 = starts[j];
        const int k1 = j + 1 < m ? starts[j + 1] : nblocks;
        float sum[ncols];
#pragma unroll
        for (int c = 0; c < ncols; ++c) {
            sum[c] = 0.0f;
        }
        for (int kb = k0; kb < k1; ++kb) {
            const block_q4_K * bx = x + kb;
            half2 dms[8];
            axle_wr_q4_K_scales(bx, dms);
#pragma unroll
            for (int s = 0; s < 8; ++s) {
                const float2 dmA = __half22float2(dms[s]);
                int v[8];
                axle_wr_q4_K_nibbles(bx, s, v);
#pragma unroll
                for (int c = 0; c < ncols; ++c) {
                    // The column's q8_1 block of 128 values holding sub-block s: [k_block][column].
                    const char * yb = vy + ((int64_t) (2*kb + s/4)*ncols_y + c)*144;
                    const float2 dsB = __half22float2(((const half2 *) yb)[s % 4]);
                    const int * yq = (const int *) (yb + 16 + 32*(s % 4));
                    int C = 0;
#pragma unroll
                    for (int i = 0; i < 8; ++i) {
                        C = ggml_cuda_dp4a(v[i], yq[i], C);
                    }
                    // As MMQ writes them (ggml_cuda_mmq_vec_dot_q8_1_q8_1_mma), so that they contract alike.
                    sum[c] += dmA.x*dsB.x*(float) C;
                    sum[c] += dmA.y*dsB.y;
                }
            }
        }
#pragma unroll
        for (int c = 0; c < ncols; ++c) {
            if (j == m - 1) {
                out[c] = sum[c];
            } else {
                others[c] += sum[c];
            }
        }
    }
    if (row >= nrows_x) {
        return;
    }
#pragma unroll
    for (int c = 0; c < ncols; ++c) {
        const float o = m > 1 ? out[c] + others[c] : out[c];
        dst[(int64_t) c*stride_col_dst + row] = bias ? o + bias[(int64_t) c*stride_col_bias + row] : o;
    }
}

// The K-quant rows kernel (Q4_K and Q6_K, 1 to 8 columns): a block of 128 threads on R rows of one
// tile over the whole K range (as the Q4_0 rows kernel), much more parallel than a thread a row.
// 0. The weights, R rows of the whole K range, to shared memory by asynchronous 16-byte copies,
//    every one in flight together (past the last row: the last row again).
// 1. A (row, weight block) pair per thread at a time, rows fastest (the threads of a warp read a
//    few column blocks, not one each; with consecutive blocks fastest instead, 4 sequences took
//    20 ms a step on the Q4_K_M 8B file): the type's integer products per 32 weights and every
//    column, to shared memory as floats (exact, below 2^24), and the block's scales; then each
//    column's scales per 32 weights.
// 2. The chains, one thread per (column, row, stretch), in K order from 0, as the type's MMQ
//    vec-dot writes them (W::chain); each leaves its sum at its stretch's first place.
// 3. The fold, one thread per (column, row), in the fixup kernel's order.
// W says what is type-specific: a weight block's bytes, the types of its scales per row (xs) and
// per column (ys; the column blocks' layout for the type), the integer products and the chain.

// The exact integer products of 32 weights (v: 8 ints of 4 int8 or nibble values, K order) with a
// column's 32 q8 values (`yq`, 16-byte aligned): of the first 16 and of the last 16.
static __device__ __forceinline__ int2 axle_wr_dot32(const int * v, const char * yq) {
    const int4 ylo = ((const int4 *) yq)[0];
    const int4 yhi = ((const int4 *) yq)[1];
    int2 C = make_int2(0, 0);
    C.x = ggml_cuda_dp4a(v[0], ylo.x, C.x);
    C.x = ggml_cuda_dp4a(v[1], ylo.y, C.x);
    C.x = ggml_cuda_dp4a(v[2], ylo.z, C.x);
    C.x = ggml_cuda_dp4a(v[3], ylo.w, C.x);
    C.y = ggml_cuda_dp4a(v[4], yhi.x, C.y);
    C.y = ggml_cuda_dp4a(v[5], yhi.y, C.y);
    C.y = ggml_cuda_dp4a(v[6], yhi.z, C.y);
    C.y = ggml_cuda_dp4a(v[7], yhi.w, C.y);
    return C;
}

// Q4_K (docs/notes/mmq-q4k-arithmetic.md): per 32 weights a half2 (d*sc, -dmin*m) of the row and
// the column's DS4 half2 (d8, sum); per 32 weights sum += dA*dB*C, then sum += mA*sB.
struct axle_wr_k_q4_K {
    static constexpr int block_bytes = sizeof(block_q4_K);
    static constexpr int xs_per_block = 8; // half2 (d*sc, -dmin*m) per 32 weights
    typedef half2 x_scale;
    typedef half2 y_scale;                 // the column's (d8, sum) per 32 weights (DS4)

    template <int ncols>
    static __device__ __forceinline__ void products(
            const char * b, const char * vy, const int ncols_y, const int kb, float * cs, const int col_stride,
            x_scale * xs) {
        static_assert(offsetof(block_q4_K, qs) % 16 == 0 && sizeof(block_q4_K) % 16 == 0,
            "16-byte reads of a Q4_K block's quants");
        const block_q4_K * bx = (const block_q4_K *) b;
        axle_wr_q4_K_scales(bx, xs);
        int q[8];
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            // Sub-blocks 2p and 2p + 1 share 32 bytes of quants (low and high nibbles), read as two
            // 16-byte pieces: the R rows' pieces of a weight block fall in different banks.
            if (s % 2 == 0) {
                const int4 * qs = (const int4 *) (bx->qs + 16*s);
                const int4 q0 = qs[0];
                const int4 q1 = qs[1];
                q[0] = q0.x; q[1] = q0.y; q[2] = q0.z; q[3] = q0.w;
                q[4] = q1.x; q[5] = q1.y; q[6] = q1.z; q[7] = q1.w;
            }
            int v[8]; // as axle_wr_q4_K_nibbles
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                v[i] = (q[i] >> (4*(s % 2))) & 0x0F0F0F0F;
            }
#pragma unroll
            for (int c = 0; c < ncols; ++c) {
                const int2 C = axle_wr_dot32(v, vy + ((int64_t) (2*kb + s/4)*ncols_y + c)*144 + 16 + 32*(s % 4));
                cs[c*col_stride + s] = (float) (C.x + C.y); // the 32 weights' exact sum
            }
        }
    }

    // A stretch of weight blocks [kb0, kb1): t the row's products per 32 weights, xs the row's
    // scales, ys the column's, each indexed by 32-weight sub-block.
    static __device__ __forceinline__ float chain(
            const float * t, const x_scale * xs, const y_scale * ys, const int kb0, const int kb1) {
        float sum = 0.0f;
        for (int sb = 8*kb0; sb < 8*kb1; ++sb) {
            const float2 dmA = __half22float2(xs[sb]);
            const float2 dsB = __half22float2(ys[sb]);
            // As MMQ writes them (ggml_cuda_mmq_vec_dot_q8_1_q8_1_mma), so that they contract alike.
            sum += dmA.x*dsB.x*t[sb];
            sum += dmA.y*dsB.y;
        }
        return sum;
    }
};

// Q6_K (docs/notes/mmq-q6k-arithmetic.md): weights q - 32 in [-32, 31]; an exact integer sum per 16
// weights times its int8 scale, added in int32 per 32 weights (isum); the column's D4 scale d8 (a
// float per 32 values, no sum); per 128 weights tmp = 0, tmp += isum*d8 four times, then
// sum += tmp*d with d the block's half scale as a float.
struct axle_wr_k_q6_K {
    static constexpr int block_bytes = sizeof(block_q6_K);
    static constexpr int xs_per_block = 1; // float(d)
    typedef float x_scale;
    typedef float y_scale;                 // the column's d8 per 32 weights (D4)

    template <int ncols>
    static __device__ __forceinline__ void products(
            const char * b, const char * vy, const int ncols_y, const int kb, float * cs, const int col_stride,
            x_scale * xs) {
        // A block in shared memory is 2-byte aligned (210 bytes a block): 16-bit reads, as MMQ's
        // loader makes them (get_int_b2).
        const block_q6_K * bx = (const block_q6_K *) b;
        *xs = __half2float(bx->d);
#pragma unroll
        for (int n = 0; n < 2; ++n) { // halves of 128 weights
            int ql[16];
            int qh[8];
#pragma unroll
            for (int t = 0; t < 16; ++t) {
                ql[t] = get_int_b2(bx->ql, 16*n + t);
            }
#pragma unroll
            for (int t = 0; t < 8; ++t) {
                qh[t] = get_int_b2(bx->qh, 8*n + t);
            }
#pragma unroll
            for (int m = 0; m < 4; ++m) { // sub-block s = 4n + m, weights 32s .. 32s + 31
                const int s = 4*n + m;
                int v[8]; // as MMQ's loader (ggml_cuda_mmq_load_tiles_q6_K), in K order
#pragma unroll
                for (int t = 0; t < 8; ++t) {
                    const int lo = (ql[8*(m % 2) + t] >> (4*(m/2))) & 0x0F0F0F0F;
                    const int hi = ((qh[t] >> (2*m)) << 4) & 0x30303030;
                    v[t] = __vsub4(lo | hi, 0x20202020);
                }
                const int sc0 = bx->scales[2*s];
                const int sc1 = bx->scales[2*s + 1];
#pragma unroll
                for (int c = 0; c < ncols; ++c) {
                    const int2 C = axle_wr_dot32(v, vy + ((int64_t) (2*kb + n)*ncols_y + c)*144 + 16 + 32*m);
                    cs[c*col_stride + s] = (float) (C.x*sc0 + C.y*sc1); // exact: |isum| < 2^24
                }
            }
        }
    }

    static __device__ __forceinline__ float chain(
            const float * t, const x_scale * xs, const y_scale * ys, const int kb0, const int kb1) {
        float sum = 0.0f;
        for (int kb = kb0; kb < kb1; ++kb) {
            const float dA = xs[kb];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                // As MMQ writes them (ggml_cuda_mmq_vec_dot_q6_K_q8_1_mma), so that they contract alike.
                float tmp = 0.0f;
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    const int sb = 8*kb + 4*h + s;
                    tmp += t[sb]*ys[sb];
                }
                sum += tmp*dA;
            }
        }
        return sum;
    }
};

template <typename W>
static constexpr __host__ __device__ size_t axle_wr_rows_k_bytes(const int ncols, const int R, const int nblocks) {
    return (size_t) R*(nblocks*W::block_bytes + 16) + (size_t) ncols*R*(8*nblocks + 1)*4 +
        (size_t) R*nblocks*W::xs_per_block*sizeof(typename W::x_scale) + (size_t) ncols*8*nblocks*sizeof(typename W::y_scale);
}

template <typename W, int ncols>
__launch_bounds__(AXLE_WR_ROWS_THREADS)
static __global__ void axle_wr_rows_k(
        const char * __restrict__ vx, const char * __restrict__ vy, float * dst, const float * bias,
        const int stride_col_bias, const axle_wr_split sp, const int R, const int nrows_x, const int stride_row_x,
        const int ncols_y, const int stride_col_dst, const int ntiles) {
    ggml_cuda_pdl_lc(); // programmatic dependent launch, as in column-invariant-mmvq.cu
    ggml_cuda_pdl_sync();
    extern __shared__ __align__(16) char axle_wr_k_smem[];
    typedef typename W::x_scale x_scale;
    typedef typename W::y_scale y_scale;
    const int nblocks = sp.nblocks;
    const int nsub = 8*nblocks;
    const int stride = nsub + 1;                               // floats per (column, row), padded
    const int stage_stride = nblocks*W::block_bytes + 16;      // bytes per row, padded
    char * stage = axle_wr_k_smem;                             // [row] raw weight blocks
    float * cs = (float *) (stage + R*stage_stride);           // [column][row][32 weights] products
    x_scale * xs = (x_scale *) (cs + ncols*R*stride);          // [row][block][xs_per_block]
    y_scale * ys = (y_scale *) (xs + R*nblocks*W::xs_per_block); // [column][32 weights]
    __shared__ int starts[AXLE_WR_K_MAX_STRETCHES];
    __shared__ int nstretches;
    const int tid = threadIdx.x;
    const int row0 = blockIdx.x*R;
    const int it = row0/AXLE_WR_TILE_ROWS;

    // 0. The weights (a row's bytes are a multiple of 16: axle_wr_takes).
    const int row_pieces = nblocks*W::block_bytes/16;
    for (int k = tid; k < R*row_pieces; k += AXLE_WR_ROWS_THREADS) {
        const int r = k / row_pieces;
        const int p = k - r*row_pieces;
        const int64_t row = min(row0 + r, nrows_x - 1);
        cp_async_cg_16<0>(ggml_cuda_cvta_generic_to_shared(stage + r*stage_stride + 16*p),
            vx + row*stride_row_x*(int64_t) W::block_bytes + 16*p);
    }
    if (tid == 0) {
        nstretches = axle_wr_tile_stretches<1>(it, sp, ntiles, starts, AXLE_WR_K_MAX_STRETCHES);
    }

    cp_async_wait_all();
    __syncthreads();

    // 1. Integer products and scales, rows fastest.
    for (int w = tid; w < R*nblocks; w += AXLE_WR_ROWS_THREADS) {
        const int r = w % R;
        const int kb = w / R;
        W::template products<ncols>(stage + r*stage_stride + kb*W::block_bytes, vy, ncols_y, kb,
            cs + r*stride + 8*kb, R*stride, xs + (r*nblocks + kb)*W::xs_per_block);
    }
    for (int w = tid; w < ncols*nsub; w += AXLE_WR_ROWS_THREADS) {
        const int c = w / nsub;
        const int sb = w - c*nsub;
        // A column block of 128 values starts with its 4 scales, one per 32 values (W::y_scale).
        ys[w] = ((const y_scale *) (vy + ((int64_t) (sb/4)*ncols_y + c)*144))[sb % 4];
    }
    __syncthreads();

    // 2. The chains.
    const int m = nstretches;
    axle_wr_each_chain(ncols, R, starts, m, nblocks, [&](const int c, const int r, const int kb0, const int kb1) {
        float * t = cs + (c*R + r)*stride;
        // Only this thread reads or writes [8*kb0, 8*kb1) of this row.
        t[8*kb0] = W::chain(t, xs + r*nblocks*W::xs_per_block, ys + c*nsub, kb0, kb1);
    });
    __syncthreads();

    // 3. The fold.
    axle_wr_fold_rows(cs, stride, 8, ncols, R, row0, starts, m, {dst, bias, stride_col_dst, stride_col_bias, nrows_x});
}

// Rows a block of axle_wr_rows_k takes: as for Q4_0, the fewest, a power of two up to 32 (a block
// stays in one tile), that give each thread a weight block, fewer where shared memory asks; 0
// where one row does not fit (then, for Q4_K, a thread a row: axle_wr_q4_K).
template <typename W>
static int axle_wr_rows_k_for(const int ncols, const int nblocks) {
    return axle_wr_rows_pick(nblocks, 0, [&](const int R) { return axle_wr_rows_k_bytes<W>(ncols, R, nblocks); });
}

// Per device: the kernel's counters, zeroed once (each op leaves them zero). One op at a time per
// device: ggml runs a graph's nodes on one stream; two engines replaying on one device from
// different streams at the same time would share them (not supported).
static int * axle_wr_counters[GGML_CUDA_MAX_DEVICES] = {nullptr};

// Whether MMQ runs `type` on a device of compute capability `cc` as the replay assumes, for every
// column tile it may pick: I = 128 rows, K iterations of 256 weights, stream-k, the MMA layout.
static bool axle_wr_config_is_analysed(const ggml_type type, const int cc) {
    for (int J = 8; J <= 128; J += 8) {
        for (const bool fallback : {false, true}) {
            const ggml_cuda_mmq_config config = ggml_cuda_mmq_get_config(type, J, fallback, cc);
            if (config.type != GGML_TYPE_COUNT && (config.I != AXLE_WR_TILE_ROWS ||
                    config.K_vram != MMQ_ITER_K || !config.stream_k || !config.use_mma_data_layout(cc))) {
                return false;
            }
        }
    }
    return true;
}

// Whether the replay of `type` is on: not turned off by `env`=0, and MMQ's configuration for it is
// the analysed one on every device.
static bool axle_wr_type_enabled(const ggml_type type, const char * env) {
    const char * value = getenv(env);
    if (value != nullptr && strcmp(value, "0") == 0) {
        return false;
    }
    for (int id = 0; id < ggml_cuda_info().device_count; ++id) {
        if (!axle_wr_config_is_analysed(type, ggml_cuda_info().devices[id].cc)) {
            return false;
        }
    }
    return true;
}

// Whether every CUDA device of this process runs Q4_0 products of 9 to 128 columns as analysed
// above: NVIDIA, MMQ's tensor-core path with ggml's "ampere" configuration (Ampere to Hopper;
// Blackwell has a table of its own), I = 128, K iterations of 256 and stream-k for every column
// tile. The first call allocates the kernel's counters on every device; Axle asks at load, before
// any CUDA graph is captured. AXLE_WIDE_REPLAY=0 turns it off (measurements). Exported through the CUDA registry's
// get_proc_address as "axle_wide_replay_mmq".
extern "C" bool ggml_cuda_axle_wr_supports(ggml_type type) {
    static const bool enabled = [] {
        const char * env = getenv("AXLE_WIDE_REPLAY");
        if (env != nullptr && strcmp(env, "0") == 0) {
            return false;
        }
        if (ggml_cuda_info().device_count == 0) {
            return false;
        }
        for (int id = 0; id < ggml_cuda_info().device_count; ++id) {
            const int cc = ggml_cuda_info().devices[id].cc;
            if (!ampere_mma_available(cc) || blackwell_mma_available(cc) ||
                    ggml_cuda_info().devices[id].warp_size != WARP_SIZE ||
                    ggml_cuda_info().devices[id].smpbo < (size_t) axle_wr_shared_bytes<8>() ||
                    ggml_cuda_info().devices[id].smpbo < (size_t) AXLE_WR_ROWS_MAX_BYTES ||
                    ggml_cuda_info().devices[id].nsm + 2 > AXLE_WR_K_MAX_STRETCHES) {
                return false;
            }
            if (!axle_wr_config_is_analysed(GGML_TYPE_Q4_0, cc)) {
                return false;
            }
        }
        // The kernel's counters, before any graph is captured (the backend asks this at load).
        int current = 0;
        CUDA_CHECK(cudaGetDevice(&current));
        for (int id = 0; id < ggml_cuda_info().device_count; ++id) {
            ggml_cuda_set_device(id);
            CUDA_CHECK(cudaMalloc((void **) &axle_wr_counters[id], AXLE_WR_COUNTERS*sizeof(int)));
            CUDA_CHECK(cudaMemset(axle_wr_counters[id], 0, AXLE_WR_COUNTERS*sizeof(int)));
        }
        ggml_cuda_set_device(current);
        return true;
    }();
    // Q4_K: exact on the H100 and H200, and it lifts an engine of 64 sequences on a Q4_K_M file
    // from 0.63x to 1.36-1.52x libllama (wide products take MMQ for Q4_K instead of the
    // column-invariant kernel); 1.00x alone and 0.93x at 4 sequences (H200). Q6_K: the same kernel
    // with MMQ's Q6_K arithmetic. AXLE_WIDE_REPLAY_Q4K=0 or AXLE_WIDE_REPLAY_Q6K=0 turns one off
    // alone (measurements).
    static const bool q4_K = axle_wr_type_enabled(GGML_TYPE_Q4_K, "AXLE_WIDE_REPLAY_Q4K");
    static const bool q6_K = axle_wr_type_enabled(GGML_TYPE_Q6_K, "AXLE_WIDE_REPLAY_Q6K");
    return enabled && (type == GGML_TYPE_Q4_0 || (type == GGML_TYPE_Q4_K && q4_K) || (type == GGML_TYPE_Q6_K && q6_K));
}

// MMQ's grid for one column tile of `nrows_x` rows of `nblocks` weight blocks on this device: the
// tiles themselves where they fill 90% of the waves, else the SM count.
static axle_wr_split axle_wr_split_for(const int nrows_x, const int nblocks, int & ntiles) {
    const int nsm = ggml_cuda_info().devices[ggml_cuda_get_device()].nsm;
    ntiles = (nrows_x + AXLE_WR_TILE_ROWS - 1)/AXLE_WR_TILE_ROWS;
    const int nwaves = (ntiles + nsm - 1)/nsm;
    const int efficiency = 100*ntiles/(nsm*nwaves);
    const int G = efficiency >= 90 ? ntiles : nsm;
    const int T = ntiles*nblocks;
    return {nblocks, G, T/G, T % G};
}

template <int ncols>
static void axle_wr_launch(
        ggml_backend_cuda_context & ctx, const char * vx, const char * vy, float * dst, const float * bias,
        const int stride_col_bias, const int nblocks, const int nrows_x, const int stride_row_x, const int ncols_y,
        const int stride_col_dst, cudaStream_t stream) {
    const int id = ggml_cuda_get_device();
    int ntiles = 0;
    const axle_wr_split sp = axle_wr_split_for(nrows_x, nblocks, ntiles);
    const int G = sp.G;
    // One column: the rows kernel. More: the grid kernel (with 4 columns the rows kernel made a
    // step of 4 sequences 2% to 19% slower, by how its rows a block were picked).
    if constexpr (ncols == 1) {
        CUDA_SET_SHARED_MEMORY_LIMIT(axle_wr_rows_q4_0<ncols>, AXLE_WR_ROWS_MAX_BYTES);
        const int R = axle_wr_rows_for(ncols, nblocks);
        if (R > 0) {
            const size_t nbytes = axle_wr_rows_shared_bytes(ncols, R, nblocks);
            axle_launch(axle_wr_rows_q4_0<ncols>,
                ggml_cuda_kernel_launch_params((nrows_x + R - 1)/R, AXLE_WR_ROWS_THREADS, nbytes, stream),
                vx, vy, dst, bias, stride_col_bias, sp, R, nrows_x, stride_row_x, ncols_y, stride_col_dst, ntiles);
            return;
        }
    }
    ggml_cuda_pool_alloc<float> partials(ctx.pool(id), (size_t) G*2*ncols*AXLE_WR_TILE_ROWS);
    constexpr int nbytes = axle_wr_shared_bytes<ncols>();
    CUDA_SET_SHARED_MEMORY_LIMIT(axle_wr_q4_0<ncols>, nbytes);
    axle_launch(axle_wr_q4_0<ncols>, ggml_cuda_kernel_launch_params(dim3(G, AXLE_WR_PARTS, 1), AXLE_WR_THREADS, nbytes, stream),
        vx, vy, dst, bias, stride_col_bias, partials.get(), axle_wr_counters[id], sp, nrows_x, stride_row_x, ncols_y,
        stride_col_dst, ntiles);
}

// Q4_K and Q6_K: the rows kernel where a row fits its shared memory, else (Q4_K only; axle_wr_takes
// refuses such Q6_K products) a thread a row.
template <typename W, int ncols>
static void axle_wr_launch_k(
        const char * vx, const char * vy, float * dst, const float * bias, const int stride_col_bias,
        const int nblocks, const int nrows_x, const int stride_row_x, const int ncols_y, const int stride_col_dst,
        cudaStream_t stream) {
    int ntiles = 0;
    const axle_wr_split sp = axle_wr_split_for(nrows_x, nblocks, ntiles);
    const int R = axle_wr_rows_k_for<W>(ncols, nblocks);
    if (R > 0) {
        const size_t nbytes = axle_wr_rows_k_bytes<W>(ncols, R, nblocks);
        CUDA_SET_SHARED_MEMORY_LIMIT((axle_wr_rows_k<W, ncols>), AXLE_WR_ROWS_MAX_BYTES);
        axle_launch(axle_wr_rows_k<W, ncols>,
            ggml_cuda_kernel_launch_params((nrows_x + R - 1)/R, AXLE_WR_ROWS_THREADS, nbytes, stream),
            vx, vy, dst, bias, stride_col_bias, sp, R, nrows_x, stride_row_x, ncols_y, stride_col_dst, ntiles);
        return;
    }
    if constexpr (std::is_same_v<W, axle_wr_k_q4_K>) {
        axle_launch(axle_wr_q4_K<ncols>,
            ggml_cuda_kernel_launch_params((nrows_x + AXLE_WR_K_THREADS - 1)/AXLE_WR_K_THREADS, AXLE_WR_K_THREADS, 0, stream),
            vx, vy, dst, bias, stride_col_bias, sp, nrows_x, stride_row_x, ncols_y, stride_col_dst, ntiles);
    } else {
        GGML_ABORT("axle_wr_launch_k: a row of %d blocks does not fit the rows kernel", nblocks);
    }
}

// Whether the replay takes `src0 @ src1` for `mm` (a product carrying Axle's hint): a 2-D Q4_0,
// Q4_K or Q6_K weight outside the compute buffer whose rows are whole K iterations of at most
// AXLE_WR_MAX_K weights (for Q6_K, a multiple of 16 bytes that fits the rows kernel), 1 to 8 F32
// columns.
static bool axle_wr_takes(const ggml_tensor * src0, const ggml_tensor * src1, const ggml_tensor * mm) {
    return ggml_cuda_axle_wr_supports(src0->type) && ggml_cuda_axle_plain_product(src0, src1, mm) &&
        src1->ne[1] >= 1 && src1->ne[1] <= 8 &&
        src0->ne[0] % MMQ_ITER_K == 0 && src0->ne[0] <= AXLE_WR_MAX_K &&
        (src0->ne[1] + AXLE_WR_TILE_ROWS - 1)/AXLE_WR_TILE_ROWS*AXLE_WR_PARTS <= AXLE_WR_COUNTERS &&
        src0->nb[1] % 16 == 0 && (uintptr_t) src0->data % 16 == 0 &&
        (src0->type != GGML_TYPE_Q6_K || axle_wr_rows_k_for<axle_wr_k_q6_K>(src1->ne[1], src0->ne[0]/QK_K) > 0);
}

// `out = src0 @ src1 (+ bias)` by the replay, for an op axle_wr_takes.
static void axle_wr_run(
        ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * out,
        const ggml_tensor * bias) {
    cudaStream_t stream = ctx.stream();
    const int64_t ne10 = src1->ne[0];
    const int64_t ne11 = src1->ne[1];
    const int64_t ne10_padded = GGML_PAD(ne10, MATRIX_ROW_PADDING);
    const int64_t s11 = src1->nb[1]/sizeof(float);
    // MMQ's own quantization of the columns (each column's values do not depend on the others).
    ggml_cuda_pool_alloc<char> src1_q8_1(ctx.pool(), ne11*ne10_padded*sizeof(block_q8_1)/QK8_1);
    quantize_mmq_q8_1_cuda((const float *) src1->data, nullptr, src1_q8_1.get(), src0->type, ne10, s11, s11*ne11,
        s11*ne11, ne10_padded, ne11, 1, 1, stream);
    CUDA_CHECK(cudaGetLastError());

    const char * vx = (const char *) src0->data;
    const char * vy = src1_q8_1.get();
    float * d = (float *) out->data;
    const float * b = bias ? (const float *) bias->data : nullptr;
    const int stride_col_bias = bias ? bias->nb[1]/sizeof(float) : 0;
    const int nblocks = src0->ne[0]/ggml_blck_size(src0->type);
    const int nrows_x = src0->ne[1];
    const int stride_row_x = src0->nb[1]/ggml_type_size(src0->type);
    const int stride_col_dst = out->nb[1]/sizeof(float);
    const int ncols_y = ne11;
    const ggml_type type = src0->type;
    switch (ne11) {
#define AXLE_WR_CASE(n) \
        case n: \
            if (type == GGML_TYPE_Q4_K) { \
                axle_wr_launch_k<axle_wr_k_q4_K, n>(vx, vy, d, b, stride_col_bias, nblocks, nrows_x, stride_row_x, \
                    ncols_y, stride_col_dst, stream); \
            } else if (type == GGML_TYPE_Q6_K) { \
                axle_wr_launch_k<axle_wr_k_q6_K, n>(vx, vy, d, b, stride_col_bias, nblocks, nrows_x, stride_row_x, \
                    ncols_y, stride_col_dst, stream); \
            } else { \
                axle_wr_launch<n>(ctx, vx, vy, d, b, stride_col_bias, nblocks, nrows_x, stride_row_x, ncols_y, \
                    stride_col_dst, stream); \
            } \
            break;
        AXLE_WR_CASE(1) AXLE_WR_CASE(2) AXLE_WR_CASE(3) AXLE_WR_CASE(4)
        AXLE_WR_CASE(5) AXLE_WR_CASE(6) AXLE_WR_CASE(7) AXLE_WR_CASE(8)
#undef AXLE_WR_CASE
        default: GGML_ABORT("axle_wr_run: %lld columns", (long long) ne11);
    }
}

// Runs `dst = src0 @ src1` with the kernels above if `dst` carries Axle's hint and the op fits
// (axle_wr_takes); false otherwise, and the caller goes on with ggml's own choice.
bool ggml_cuda_axle_wr_mul_mat(
        ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst) {
    if (ggml_get_op_params_i32(dst, 1) != AXLE_HINT_WIDE_REPLAY) {
        return false;
    }
    // A hinted product the kernel cannot take would lose its invariance without a sign: say so.
    if (!axle_wr_takes(src0, src1, dst)) {
        static bool warned = false; // once per process
        if (!warned) {
            warned = true;
            GGML_LOG_WARN("%s: Axle's replay of MMQ refused for %s (%s weight, %lld columns): ggml's kernel runs it, "
                "and its columns may round differently by batch\n", __func__, dst->name, ggml_type_name(src0->type),
                (long long) src1->ne[1]);
        }
        return false;
    }
    axle_wr_run(ctx, src0, src1, dst, nullptr);
    return true;
}

// ggml's graph fusion of a product with the add that follows it, for a product carrying Axle's
// hint: `out = mm + bias` in one kernel, the add made where the product's value is written (a
// float addition, so the same bits as ggml's add of the two, in either order). False where the
// product is not hinted or the op does not fit; then the nodes run one by one.
bool ggml_cuda_axle_wr_mul_mat_add(
        ggml_backend_cuda_context & ctx, const ggml_tensor * mm, const ggml_tensor * bias, ggml_tensor * out) {
    if (ggml_get_op_params_i32(mm, 1) != AXLE_HINT_WIDE_REPLAY || !axle_wr_takes(mm->src[0], mm->src[1], mm) ||
            mm->src[2] != nullptr || bias->type != GGML_TYPE_F32 || out->type != GGML_TYPE_F32 ||
            !ggml_are_same_shape(mm, bias) || !ggml_are_same_shape(mm, out) ||
            bias->nb[0] != sizeof(float) || out->nb[0] != sizeof(float) ||
            bias->nb[1] % sizeof(float) != 0 || out->nb[1] % sizeof(float) != 0) {
        return false;
    }
    axle_wr_run(ctx, mm->src[0], mm->src[1], out, bias);
    return true;
}
