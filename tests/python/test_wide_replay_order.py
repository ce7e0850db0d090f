"""The order in which Axle's replay of MMQ (crates/axle-kernels/cuda/wide-replay-mmq.cu) adds a tile's
stretches, against the order of ggml's stream-k MMQ kernel and its fix-up kernel
(ggml-cuda/mmq.cuh in the vendored llama.cpp), over many weight shapes and SM counts.

Both sides are transcribed here as index arithmetic on symbols: ("p", b, tile) stands for block
b's float sum over its stretch of the tile (the same chain of fused multiply-adds on both sides),
and ("+", x, y) for one float addition (commutative, not associative). A tile's result must be the
same tree on both sides, and every stretch the replay reads must be the one its block wrote
(the kernel keeps two slots per block). Run by the README's test command (pytest tests/python).
"""

import itertools

ITER_BLOCKS = 8  # MMQ_ITER_K / QK4_0: stretches start on multiples of 8 weight blocks of a tile


def stream_k_grid(ntiles: int, nsm: int) -> int:
    """launch_mul_mat_q's grid for one column tile: the tiles where they fill 90% of the waves."""
    waves = (ntiles + nsm - 1) // nsm
    return ntiles if 100 * ntiles // (nsm * waves) >= 90 else nsm


def kbc(b: int, ntiles: int, nblocks: int, grid: int) -> int:
    k = b * (ntiles * nblocks) // grid
    return k - (k % nblocks) % ITER_BLOCKS


def kbc_32bit(b: int, ntiles: int, nblocks: int, grid: int) -> int:
    """The replay's form: b*q + b*rem/G, from T = q*G + rem."""
    total = ntiles * nblocks
    q, rem = divmod(total, grid)
    k = b * q + b * rem // grid
    return k - (k % nblocks) % ITER_BLOCKS


def ggml_tiles(ntiles: int, nblocks: int, grid: int) -> dict:
    """mul_mat_q (stream-k) then mul_mat_q_stream_k_fixup: each tile's result."""
    dst, tmp = {}, {}
    for b in range(grid):
        k, stop = kbc(b, ntiles, nblocks, grid), kbc(b + 1, ntiles, nblocks, grid)
        k0 = k % nblocks
        k1 = min(nblocks, k0 + stop - k)
        while k < stop and k1 == nblocks:
            dst[k // nblocks] = ("p", b, k // nblocks)
            k += nblocks
            k -= k % nblocks
            k1 = min(nblocks, stop - k)
        if k < stop:
            tmp[b] = ("p", b, k // nblocks)
    if ntiles % grid == 0:
        return dst
    for b0 in range(grid):
        k0, k0_stop = kbc(b0, ntiles, nblocks, grid), kbc(b0 + 1, ntiles, nblocks, grid)
        if (
            k0 == k0_stop
            or k0 % nblocks == 0
            or (k0 // nblocks == k0_stop // nblocks and k0_stop % nblocks != 0)
        ):
            continue
        total, any_fixup = 0.0, False
        bidx, k_stop = b0 - 1, k0
        while True:
            k = kbc(bidx, ntiles, nblocks, grid)
            if k == k_stop:
                bidx -= 1
                k_stop = k
                continue
            any_fixup = True
            total = ("+", total, tmp[bidx])
            if k % nblocks == 0 or k // nblocks < k0 // nblocks:
                break
            bidx -= 1
            k_stop = k
        if any_fixup:
            tile = k0 // nblocks
            dst[tile] = ("+", dst[tile], total)
    return dst


def replay_tiles(ntiles: int, nblocks: int, grid: int) -> dict:
    """axle_wr_q4_0: whole tiles written, stretches kept in two slots a block, and the last
    block to reach a tile's counter folding them."""
    def k_of(b):
        return kbc_32bit(b, ntiles, nblocks, grid)

    def slot(bb, tile):
        return 0 if k_of(bb) > tile * nblocks else 1

    dst, slots, counters, arrivals = {}, {}, {}, []
    for b in range(grid):
        k, stop = k_of(b), k_of(b + 1)
        while k < stop:
            tile, k0 = divmod(k, nblocks)
            k1 = min(nblocks, k0 + stop - k)
            if k0 == 0 and k1 == nblocks:
                dst[tile] = ("p", b, tile)
            else:
                assert (b, slot(b, tile)) not in slots, "two stretches of a block in one slot"
                slots[(b, slot(b, tile))] = ("p", b, tile)
                arrivals.append((b, tile))
            k += nblocks - k0
    # Any arrival order: the fold reads only what the tile's blocks wrote; take the last one.
    for b, tile in arrivals:
        first = tile * grid // ntiles
        while k_of(first + 1) <= tile * nblocks:
            first += 1
        n, last, bb, kb = 0, first, first, k_of(first)
        while bb < grid and kb < (tile + 1) * nblocks:
            kb_next = k_of(bb + 1)
            if kb_next > kb:
                n += 1
                last = bb
            kb = kb_next
            bb += 1
        counters[tile] = counters.get(tile, 0) + 1
        if counters[tile] != n:
            continue
        others, kb_next = 0.0, k_of(last)
        for bb in range(last - 1, first - 1, -1):
            kb = k_of(bb)
            if kb < kb_next:
                part = slots[(bb, slot(bb, tile))]
                assert part == ("p", bb, tile), "read a stretch of another tile"
                others = ("+", others, part)
            kb_next = kb
        part = slots[(last, slot(last, tile))]
        assert part == ("p", last, tile)
        dst[tile] = ("+", part, others)
    for tile, count in counters.items():
        assert tile in dst, f"tile {tile}: {count} stretches, never folded"
    return dst


def rows_tiles(ntiles: int, nblocks: int, grid: int) -> dict:
    """axle_wr_rows_q4_0: each tile's stretches found from the stream-k blocks, one chain per
    stretch over exactly that block's part of the tile, and the fold in the fix-up order."""
    def k_of(b):
        return kbc_32bit(b, ntiles, nblocks, grid)

    dst = {}
    for tile in range(ntiles):
        tile0, tile1 = tile * nblocks, (tile + 1) * nblocks
        b = tile * grid // ntiles
        while k_of(b + 1) <= tile0:
            b += 1
        starts = []
        k = k_of(b)
        while b < grid:
            k_next = k_of(b + 1)
            lo = max(k, tile0)
            if min(k_next, tile1) > lo:
                starts.append(lo - tile0)
            if k_next >= tile1:
                break
            k = k_next
            b += 1
        chains = []
        for j, k0 in enumerate(starts):
            k1 = starts[j + 1] if j + 1 < len(starts) else nblocks
            # The block whose range holds this stretch, and that it is all of its part of the tile.
            owner = [bb for bb in range(grid) if k_of(bb) <= tile0 + k0 < k_of(bb + 1)]
            assert len(owner) == 1
            bb = owner[0]
            assert (max(k_of(bb), tile0), min(k_of(bb + 1), tile1)) == (tile0 + k0, tile0 + k1)
            chains.append(("p", bb, tile))
        out = chains[-1]
        if len(chains) > 1:
            others = 0.0
            for part in reversed(chains[:-1]):
                others = ("+", others, part)
            out = ("+", out, others)
        dst[tile] = out
    return dst


def canonical(tree):
    """The same float additions up to the order of each one's two operands."""
    if isinstance(tree, tuple) and tree[0] == "+":
        a, b = canonical(tree[1]), canonical(tree[2])
        return ("+",) + tuple(sorted((a, b), key=repr))
    return tree


def test_both_replay_kernels_add_every_tile_as_mmq_and_its_fixup_do():
    shapes = [128, 256, 1000, 1024, 4096, 4100, 6144, 14336, 28672, 128256]
    ks = [256, 512, 2048, 4096, 5120, 14336]
    sms = [20, 78, 108, 114, 132]
    checked = 0
    for nrows, k, nsm in itertools.product(shapes, ks, sms):
        ntiles = (nrows + 127) // 128
        nblocks = k // 32
        grid = stream_k_grid(ntiles, nsm)
        assert all(
            kbc(b, ntiles, nblocks, grid) == kbc_32bit(b, ntiles, nblocks, grid)
            for b in range(grid + 1)
        )
        want = ggml_tiles(ntiles, nblocks, grid)
        got = replay_tiles(ntiles, nblocks, grid)
        rows = rows_tiles(ntiles, nblocks, grid)
        assert sorted(want) == list(range(ntiles)), (nrows, k, nsm)
        for tile in range(ntiles):
            assert canonical(got[tile]) == canonical(want[tile]), (nrows, k, nsm, tile)
            assert canonical(rows[tile]) == canonical(want[tile]), (nrows, k, nsm, tile)
        checked += 1
    assert checked == len(shapes) * len(ks) * len(sms)


def test_some_shapes_split_tiles_into_several_stretches():
    # The comparison above means something only where tiles are split: 4096 rows of 4096
    # weights on 132 SMs give every tile 4 or 5 stretches.
    tiles = ggml_tiles(32, 128, stream_k_grid(32, 132))

    def stretches(tree):
        if isinstance(tree, tuple) and tree[0] == "+":
            return stretches(tree[1]) + stretches(tree[2])
        return 1 if isinstance(tree, tuple) else 0

    assert all(stretches(t) >= 4 for t in tiles.values())
    assert stream_k_grid(1002, 132) == 1002  # the output head of a 128K vocabulary: no split
