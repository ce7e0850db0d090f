// Test and benchmark of paged-attention.cuh on the GPU, without ggml:
//   nvcc -O3 -use_fast_math -std=c++17 -arch=sm_90 paged-attention-test.cu -o paged-attention-test
// (-use_fast_math as ggml's CUDA backend is built: expf and tanhf become the fast intrinsics).
//   ./paged-attention-test            # checks, then the benchmark table
//   ./paged-attention-test --check    # checks only
// Checks: every row against a plain double-precision reference on the host (softmax attention
// over the row's keys, with window, soft cap and sinks); and exactness: a row's output bits are
// the same alone, in a batch of rows of other sequences and lengths, as one of its sequence's
// verify rows, and with its blocks at other places in the cache; for F16 and Q8_0 caches. Exit
// status 1 on any failure.
// The benchmark times one launch for Llama-3-8B's heads (32 query, 8 KV, 128 wide) at the
// batch sizes and context lengths of issue 52 and prints the share of the card's bandwidth that
// reading the keys and values reaches.
#include "paged-attention.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(2); } } while (0)

struct Shape { int head_dim, n_head, n_head_kv, block_size, window; float softcap; bool sinks; };

// ggml's Q8_0 rounding of 32 values: scale amax / 127 (stored as F16), int8 round(x / scale).
static void quantize_q8_0(const float * x, char * out, float * back) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
    const half dh = __float2half(d);
    memcpy(out, &dh, 2);
    for (int i = 0; i < 32; ++i) {
        const signed char q = (signed char) roundf(x[i] * id);
        out[2 + i] = (char) q;
        back[i] = __half2float(dh) * (float) q;
    }
}

// A cache of `n_blocks` blocks with random keys and values, and sequences placed in it: the
// cache's bytes (F16 or Q8_0) and the values they hold.
struct World {
    Shape s;
    bool q8;
    int n_blocks;
    std::vector<float> k, v;       // [slots][n_head_kv * head_dim]: the values the cache holds
    std::vector<char> kb, vb;      // [slots][row_bytes]: the cache
    std::vector<float> sinks;
    std::mt19937 rng;
    World(Shape s_, bool q8_, int n_blocks_, unsigned seed) : s(s_), q8(q8_), n_blocks(n_blocks_), rng(seed) {
        const size_t slots = (size_t) n_blocks * s.block_size, n = slots * row_elems();
        k.resize(n); v.resize(n); kb.resize(slots * row_bytes()); vb.resize(slots * row_bytes());
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (size_t i = 0; i < n; ++i) { k[i] = u(rng); v[i] = u(rng); }
        for (auto * p : {&k, &v}) {
            char * bytes = p == &k ? kb.data() : vb.data();
            for (size_t i = 0; i < n; i += 32) {
                if (q8) {
                    quantize_q8_0(p->data() + i, bytes + i / 32 * 34, p->data() + i);
                } else {
                    for (size_t j = i; j < i + 32; ++j) {
                        const half h = __float2half((*p)[j]);
                        memcpy(bytes + j * 2, &h, 2);
                        (*p)[j] = __half2float(h);
                    }
                }
            }
        }
        sinks.resize(s.n_head);
        for (auto & x : sinks) x = u(rng);
    }
    size_t row_elems() const { return (size_t) s.n_head_kv * s.head_dim; }
    size_t row_bytes() const { return q8 ? row_elems() / 32 * 34 : row_elems() * 2; }
};

struct Row { std::vector<int> blocks; int end; std::vector<float> q; };

// Runs rows on the device; returns dst.
static std::vector<float> run(const World & w, const std::vector<Row> & rows, float scale) {
    const Shape & s = w.s;
    std::vector<int32_t> rowv, table;
    int max_end = 0;
    for (auto & r : rows) {
        rowv.push_back((int32_t) table.size());
        rowv.push_back(r.end);
        table.insert(table.end(), r.blocks.begin(), r.blocks.end());
        max_end = std::max(max_end, r.end);
    }
    if (table.empty()) table.push_back(0);
    const size_t qn = (size_t) rows.size() * s.n_head * s.head_dim;
    std::vector<float> q(qn);
    for (size_t i = 0; i < rows.size(); ++i) std::copy(rows[i].q.begin(), rows[i].q.end(), q.begin() + i * s.n_head * s.head_dim);
    axle_pa_args a = {};
    a.head_dim = s.head_dim; a.n_head = s.n_head; a.n_head_kv = s.n_head_kv; a.n_rows = (int) rows.size();
    a.block_size = s.block_size; a.window = s.window; a.scale = scale; a.softcap = s.softcap;
    a.max_chunks = std::max(1, (max_end + AXLE_PA_CHUNK - 1) / AXLE_PA_CHUNK);
    a.q_nb1 = s.head_dim * 4; a.q_nb2 = (size_t) s.n_head * s.head_dim * 4;
    a.k_nb1 = a.v_nb1 = w.row_bytes();
    a.q8 = w.q8;
    char *dq, *dk, *dv; int32_t *drows, *dtable; float *dsinks = nullptr, *ddst, *dpart;
    CHECK(cudaMalloc(&dq, qn * 4)); CHECK(cudaMemcpy(dq, q.data(), qn * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&dk, w.kb.size())); CHECK(cudaMemcpy(dk, w.kb.data(), w.kb.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&dv, w.vb.size())); CHECK(cudaMemcpy(dv, w.vb.data(), w.vb.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&drows, rowv.size() * 4)); CHECK(cudaMemcpy(drows, rowv.data(), rowv.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&dtable, table.size() * 4)); CHECK(cudaMemcpy(dtable, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    if (s.sinks) { CHECK(cudaMalloc(&dsinks, s.n_head * 4)); CHECK(cudaMemcpy(dsinks, w.sinks.data(), s.n_head * 4, cudaMemcpyHostToDevice)); }
    CHECK(cudaMalloc(&ddst, qn * 4));
    // Poison the scratch: a combine that read a chunk no block wrote would show.
    const size_t scratch = axle_pa_scratch_floats(a);
    CHECK(cudaMalloc(&dpart, scratch * 4)); CHECK(cudaMemset(dpart, 0xff, scratch * 4));
    a.q = dq; a.k = dk; a.v = dv; a.rows = drows; a.table = dtable; a.sinks = dsinks; a.dst = ddst;
    a.part = dpart; a.part_ml = dpart + (size_t) a.n_rows * a.n_head * a.max_chunks * a.head_dim;
    if (!axle_pa_launch(a, 0)) { fprintf(stderr, "shape refused\n"); exit(2); }
    CHECK(cudaGetLastError()); CHECK(cudaDeviceSynchronize());
    std::vector<float> out(qn);
    CHECK(cudaMemcpy(out.data(), ddst, qn * 4, cudaMemcpyDeviceToHost));
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(drows); cudaFree(dtable); cudaFree(ddst); cudaFree(dpart);
    if (dsinks) cudaFree(dsinks);
    return out;
}

// The plain reference for one row, in double.
static std::vector<double> reference(const World & w, const Row & r, float scale) {
    const Shape & s = w.s;
    const int G = s.n_head / s.n_head_kv;
    const int begin = s.window > 0 && r.end > s.window ? r.end - s.window : 0;
    std::vector<double> out((size_t) s.n_head * s.head_dim, 0.0);
    for (int h = 0; h < s.n_head; ++h) {
        const int hk = h / G;
        std::vector<double> sc;
        double mx = s.sinks ? w.sinks[h] : -INFINITY;
        for (int j = begin; j < r.end; ++j) {
            const size_t slot = (size_t) r.blocks[j / s.block_size] * s.block_size + j % s.block_size;
            double d = 0;
            for (int e = 0; e < s.head_dim; ++e)
                d += (double) r.q[(size_t) h * s.head_dim + e] * w.k[slot * w.row_elems() + (size_t) hk * s.head_dim + e];
            d *= scale;
            if (s.softcap != 0.0f) d = s.softcap * std::tanh(d / s.softcap);
            sc.push_back(d);
            mx = std::max(mx, d);
        }
        double sum = s.sinks ? std::exp(w.sinks[h] - mx) : 0.0;
        for (auto & d : sc) { d = std::exp(d - mx); sum += d; }
        for (int j = begin; j < r.end; ++j) {
            const size_t slot = (size_t) r.blocks[j / s.block_size] * s.block_size + j % s.block_size;
            for (int e = 0; e < s.head_dim; ++e)
                out[(size_t) h * s.head_dim + e] += sc[j - begin] / sum * w.v[slot * w.row_elems() + (size_t) hk * s.head_dim + e];
        }
    }
    return out;
}

static Row make_row(World & w, std::vector<int> blocks, int end) {
    Row r{std::move(blocks), end, {}};
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    r.q.resize((size_t) w.s.n_head * w.s.head_dim);
    for (auto & x : r.q) x = u(w.rng);
    return r;
}

static int failures = 0;
static bool checking_q8 = false;
static void expect(bool ok, const char * what, const Shape & s) {
    if (!ok) {
        ++failures;
        fprintf(stderr, "FAIL %s (%s, head_dim %d, heads %d/%d, block %d, window %d, softcap %g, sinks %d)\n",
                what, checking_q8 ? "q8_0" : "f16", s.head_dim, s.n_head, s.n_head_kv, s.block_size, s.window, s.softcap, s.sinks);
    }
}

static void check(Shape s, bool q8) {
    checking_q8 = q8;
    const int n_blocks = 4096 / s.block_size * 3;
    World w(s, q8, n_blocks, 1234 + s.head_dim + s.n_head);
    const float scale = 1.0f / std::sqrt((float) s.head_dim);
    // Sequences of several lengths (chunk edges included), each on random distinct blocks.
    std::vector<int> perm(n_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), w.rng);
    const int lens[] = {1, 7, 255, 256, 257, 700, 1024, 2500, 4000};
    std::vector<Row> rows;
    size_t used = 0;
    for (int len : lens) {
        const int nb = (len + s.block_size - 1) / s.block_size;
        std::vector<int> blocks(perm.begin() + used, perm.begin() + used + nb);
        used += nb;
        rows.push_back(make_row(w, blocks, len));
    }
    // Verify rows: the last sequence at positions end-8..end-1, sharing its blocks.
    const Row & longest = rows.back();
    for (int t = 8; t >= 1; --t) rows.push_back(make_row(w, longest.blocks, longest.end - t));
    const std::vector<float> batched = run(w, rows, scale);
    const size_t width = (size_t) s.n_head * s.head_dim;
    for (size_t i = 0; i < rows.size(); ++i) {
        const std::vector<double> ref = reference(w, rows[i], scale);
        double err = 0;
        for (size_t e = 0; e < width; ++e) err = std::max(err, std::abs(ref[e] - batched[i * width + e]));
        expect(err < 2e-3, "output against the host reference", s);
        // Alone: the same bits.
        const std::vector<float> alone = run(w, {rows[i]}, scale);
        expect(memcmp(alone.data(), batched.data() + i * width, width * 4) == 0, "a row alone and batched give the same bits", s);
    }
    // Moved: the same keys and values at other blocks give the same bits.
    {
        World moved = w;
        Row r = rows[7];
        std::vector<int> fresh(perm.begin() + used, perm.begin() + used + r.blocks.size());
        const size_t block_bytes = (size_t) s.block_size * w.row_bytes();
        for (size_t b = 0; b < r.blocks.size(); ++b) {
            memcpy(moved.kb.data() + fresh[b] * block_bytes, w.kb.data() + r.blocks[b] * block_bytes, block_bytes);
            memcpy(moved.vb.data() + fresh[b] * block_bytes, w.vb.data() + r.blocks[b] * block_bytes, block_bytes);
        }
        Row m = r;
        m.blocks = fresh;
        const std::vector<float> a = run(w, {r}, scale), b = run(moved, {rows[0], m, rows[3]}, scale);
        expect(memcmp(a.data(), b.data() + width, width * 4) == 0, "blocks moved give the same bits", s);
    }
    // A row not computed here (end 0) is zero and leaves the others alone.
    {
        Row none = rows[2]; none.end = 0;
        const std::vector<float> out = run(w, {rows[1], none, rows[2]}, scale);
        bool zero = true;
        for (size_t e = 0; e < width; ++e) zero &= out[width + e] == 0.0f;
        expect(zero, "a row of end 0 is zero", s);
        expect(memcmp(out.data() + 2 * width, batched.data() + 2 * width, width * 4) == 0, "rows of end 0 change no other row", s);
    }
}

static void bench(bool q8) {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    int clock_khz = 0, bus_bits = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, 0);
    cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
    const double peak = 2.0 * clock_khz * 1e3 * bus_bits / 8;
    printf("\n%s cache. device: %s, peak memory bandwidth %.2f TB/s (from the clock and bus width)\n",
           q8 ? "Q8_0" : "F16", prop.name, peak / 1e12);
    printf("| rows | context | µs per launch | GB/s of K and V | share of peak |\n|---|---|---|---|---|\n");
    const int D = 128, H = 32, HKV = 8, BS = 16;
    for (int ctx : {512, 2048, 8192}) {
        for (int rows_n : {1, 16, 64, 128}) {
            const size_t slots = (size_t) rows_n * ctx;
            const size_t row_bytes = q8 ? (size_t) HKV * D / 32 * 34 : (size_t) HKV * D * 2;
            char *dk, *dv, *dq; int32_t *drows, *dtable; float *ddst, *dpart;
            CHECK(cudaMalloc(&dk, slots * row_bytes)); CHECK(cudaMalloc(&dv, slots * row_bytes));
            CHECK(cudaMemset(dk, 0, slots * row_bytes)); CHECK(cudaMemset(dv, 0, slots * row_bytes));
            std::vector<int32_t> rowv, table;
            std::vector<int32_t> blocks(slots / BS);
            std::iota(blocks.begin(), blocks.end(), 0);
            std::shuffle(blocks.begin(), blocks.end(), std::mt19937(7));
            for (int r = 0; r < rows_n; ++r) {
                rowv.push_back(r * (ctx / BS)); rowv.push_back(ctx);
            }
            table = blocks;
            axle_pa_args a = {};
            a.head_dim = D; a.n_head = H; a.n_head_kv = HKV; a.n_rows = rows_n; a.block_size = BS;
            a.scale = 0.088f; a.max_chunks = (ctx + AXLE_PA_CHUNK - 1) / AXLE_PA_CHUNK;
            a.q_nb1 = D * 4; a.q_nb2 = (size_t) H * D * 4; a.k_nb1 = a.v_nb1 = row_bytes; a.q8 = q8;
            CHECK(cudaMalloc(&dq, (size_t) rows_n * H * D * 4)); CHECK(cudaMemset(dq, 0, (size_t) rows_n * H * D * 4));
            CHECK(cudaMalloc(&drows, rowv.size() * 4)); CHECK(cudaMemcpy(drows, rowv.data(), rowv.size() * 4, cudaMemcpyHostToDevice));
            CHECK(cudaMalloc(&dtable, table.size() * 4)); CHECK(cudaMemcpy(dtable, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
            CHECK(cudaMalloc(&ddst, (size_t) rows_n * H * D * 4));
            CHECK(cudaMalloc(&dpart, axle_pa_scratch_floats(a) * 4));
            a.q = dq; a.k = dk; a.v = dv; a.rows = drows; a.table = dtable; a.dst = ddst;
            a.part = dpart; a.part_ml = dpart + (size_t) rows_n * H * a.max_chunks * D;
            cudaEvent_t t0, t1; cudaEventCreate(&t0); cudaEventCreate(&t1);
            // Warm up for 200 ms first: an idle GPU runs at a fraction of its clock, and a few
            // launches are over before it has ramped up.
            cudaEventRecord(t0);
            for (float warm = 0; warm < 200.0f;) {
                for (int i = 0; i < 20; ++i) axle_pa_launch(a, 0);
                cudaEventRecord(t1); CHECK(cudaEventSynchronize(t1));
                cudaEventElapsedTime(&warm, t0, t1);
            }
            const int reps = 200;
            cudaEventRecord(t0);
            for (int i = 0; i < reps; ++i) axle_pa_launch(a, 0);
            cudaEventRecord(t1); CHECK(cudaEventSynchronize(t1));
            float ms = 0; cudaEventElapsedTime(&ms, t0, t1);
            const double us = ms * 1e3 / reps, bytes = 2.0 * slots * row_bytes;
            printf("| %d | %d | %.1f | %.0f | %.2f |\n", rows_n, ctx, us, bytes / us / 1e3, bytes / (us * 1e-6) / peak);
            cudaFree(dk); cudaFree(dv); cudaFree(dq); cudaFree(drows); cudaFree(dtable); cudaFree(ddst); cudaFree(dpart);
        }
    }
}

int main(int argc, char ** argv) {
    const bool only_check = argc > 1 && strcmp(argv[1], "--check") == 0;
    const Shape shapes[] = {
        {128, 32, 8, 16, 0, 0.0f, false},   // Llama-3-8B
        {64, 9, 3, 16, 0, 0.0f, false},     // SmolLM2-135M
        {256, 4, 1, 16, 512, 0.0f, false},  // Gemma 3 270M, a sliding layer
        {128, 8, 8, 32, 0, 30.0f, false},   // no GQA, soft cap, larger blocks
        {64, 16, 2, 16, 300, 0.0f, true},   // group of 8, window, sinks
    };
    for (bool q8 : {false, true})
        for (const Shape & s : shapes) check(s, q8);
    printf("checks: %s (%d failures)\n", failures ? "FAILED" : "passed", failures);
    if (!only_check && !failures) { bench(false); bench(true); }
    return failures ? 1 : 0;
}
