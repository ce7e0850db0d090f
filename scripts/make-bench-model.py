#!/usr/bin/env python3
"""Writes a random-weight GGUF of a real model's shape, for speed measurements (speed does not
need real weights; quality does). Used on the GPU machine, where a real 8B file cannot travel.

The quantized blocks are random bytes with their scale fields set to small finite values, so
every weight is finite and of a plausible size; norms are ones. The vocabulary is a real byte-level
BPE one (SmolLM2's, read from its GGUF) padded with reserved control tokens up to the shape's
vocabulary size, so both libllama and Axle load it like a downloaded file.

    python3 scripts/make-bench-model.py --shape llama3-8b --type q4_0 \
        --vocab-from SmolLM2-135M-Instruct.Q4_1.gguf --out llama3-8b-q4_0.gguf

Types follow llama.cpp's quantization mixes: `q4_0` (Q4_0 matrices, Q6_K output head) and
`q4_k_m` (Q4_K, with Q6_K for the head and for attn_v / ffn_down of the layers llama.cpp gives more
bits). The gpt-oss shapes are written as the released files are, whatever `--type` says: MXFP4
experts, Q8_0 for the rest.
"""
import argparse
import importlib.util
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

SHAPES = {
    # Llama 3 8B: hidden 4096, 32 layers, 32 query / 8 KV heads of 128, FFN 14336, vocab 128256.
    "llama3-8b": dict(n_embd=4096, n_layer=32, n_head=32, n_head_kv=8, n_ff=14336,
                      n_vocab=128256, rope_base=500000.0, n_ctx=8192),
    # Llama 3 70B: hidden 8192, 80 layers, 64 query / 8 KV heads of 128, FFN 28672 (about 40 GiB
    # at Q4_K_M): a model that people split over two GPUs.
    "llama3-70b": dict(n_embd=8192, n_layer=80, n_head=64, n_head_kv=8, n_ff=28672,
                       n_vocab=128256, rope_base=500000.0, n_ctx=8192),
    # gpt-oss-20b: hidden 2880, 24 layers alternating a 128-token window and global attention,
    # 64 query / 8 KV heads of 64, 32 MXFP4 experts of 2880, top-4, vocab 201088 (about 12 GiB).
    "gpt-oss-20b": dict(arch="gpt-oss", n_embd=2880, n_layer=24, n_head=64, n_head_kv=8,
                        head_dim=64, n_ff=2880, n_vocab=201088, rope_base=150000.0, n_ctx=131072,
                        moe=dict(n_expert=32, n_used=4, n_ff_exp=2880)),
    # gpt-oss-20b scaled to about 1 GB for CPU measurements: hidden 1024, 16 layers, 16 experts
    # of 1024, top-4 (its structure otherwise).
    "gpt-oss-1b": dict(arch="gpt-oss", n_embd=1024, n_layer=16, n_head=16, n_head_kv=4,
                       head_dim=64, n_ff=1024, n_vocab=201088, rope_base=150000.0, n_ctx=131072,
                       moe=dict(n_expert=16, n_used=4, n_ff_exp=1024)),
    # A tiny one, to check the writer itself.
    "tiny": dict(n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=512,
                 n_vocab=50000, rope_base=10000.0, n_ctx=2048),
    # Llama 3.2 1B: for quick checks of the pipeline.
    "llama3-1b": dict(n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, n_ff=8192,
                      n_vocab=128256, rope_base=500000.0, n_ctx=8192),
    # Qwen3-30B-A3B scaled to about 1.1 GB at Q4_K_M: its structure (qwen3moe: QK norm, 128-wide
    # heads, 4 KV heads, top-8 softmax routing, renormalised) with hidden 1024, 24 layers and 48
    # experts of 512; about 0.45B parameters active per token. For CPU MoE speed measurements.
    "qwen3moe-1b": dict(arch="qwen3moe", n_embd=1024, n_layer=24, n_head=16, n_head_kv=4,
                        head_dim=128, n_ff=3072, n_vocab=151936, rope_base=1000000.0, n_ctx=8192,
                        moe=dict(n_expert=48, n_used=8, n_ff_exp=512)),
    # Qwen3.5/3.6-35B-A3B scaled to about 1 GB at Q4_K_M: its structure (qwen35moe: three gated
    # delta net layers of every four, gated attention with M-RoPE, routed experts plus a gated
    # shared expert) with hidden 1024, 24 layers, 8 key / 16 value heads of 128 in the linear
    # layers, 8 query / 2 KV heads of 128 in the attention layers, 64 experts of 256, top-8.
    "qwen35moe-1b": dict(arch="qwen35moe", n_embd=1024, n_layer=24, n_head=8, n_head_kv=2,
                         head_dim=128, n_ff=2048, n_vocab=151936, rope_base=10000000.0,
                         n_ctx=8192, moe=dict(n_expert=64, n_used=8, n_ff_exp=256, shared_ff=512),
                         ssm=dict(d_conv=4, n_k_heads=8, n_v_heads=16, head=128)),
}

def load_fixture_helpers():
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("make_fixtures", os.path.join(here, "make-fixtures.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    ap.add_argument("--type", choices=["q4_0", "q4_k_m"], default="q4_0")
    ap.add_argument("--vocab-from", required=True, help="a GGUF whose byte-level BPE vocabulary is reused")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--reuse-layers", action="store_true",
                    help="every layer gets the same random bytes per tensor kind and type (a 70B "
                         "file in about a minute instead of ten; speed does not depend on them)")
    a = ap.parse_args()
    cfg = SHAPES[a.shape]
    fx = load_fixture_helpers()
    vocab = fx.read_vocab(a.vocab_from)
    t, sub, tokens = vocab["tokenizer.ggml.tokens"]
    _, tsub, types = vocab["tokenizer.ggml.token_type"]
    n_vocab = cfg["n_vocab"]
    if len(tokens) > n_vocab:
        sys.exit(f"the vocabulary has {len(tokens)} tokens, more than the shape's {n_vocab}")
    pad = n_vocab - len(tokens)
    vocab["tokenizer.ggml.tokens"] = (t, sub, tokens + [f"<|reserved_{i}|>" for i in range(pad)])
    vocab["tokenizer.ggml.token_type"] = (t, tsub, list(types) + [3] * pad)
    vocab.pop("tokenizer.chat_template", None)

    rng = np.random.default_rng(a.seed)
    arch = cfg.get("arch", "llama")
    moe = cfg.get("moe")
    hd = cfg.get("head_dim", cfg["n_embd"] // cfg["n_head"])
    w = gguf.GGUFWriter(a.out, arch)
    w.add_name(f"random {a.shape} {a.type}")
    w.add_context_length(cfg["n_ctx"])
    w.add_embedding_length(cfg["n_embd"])
    w.add_block_count(cfg["n_layer"])
    w.add_feed_forward_length(cfg["n_ff"])
    w.add_head_count(cfg["n_head"])
    w.add_head_count_kv(cfg["n_head_kv"])
    ssm = cfg.get("ssm")
    w.add_rope_dimension_count(hd // 2 if ssm else hd)
    w.add_key_length(hd)
    w.add_value_length(hd)
    if moe:
        fx.add_moe_keys(w, moe["n_expert"], moe["n_used"], moe["n_ff_exp"], moe.get("shared_ff"))
    if ssm:
        w.add_array(f"{arch}.rope.dimension_sections", [11, 11, 10, 0])
        w.add_uint32(f"{arch}.ssm.conv_kernel", ssm["d_conv"])
        w.add_uint32(f"{arch}.ssm.inner_size", ssm["n_v_heads"] * ssm["head"])
        w.add_uint32(f"{arch}.ssm.state_size", ssm["head"])
        w.add_uint32(f"{arch}.ssm.time_step_rank", ssm["n_v_heads"])
        w.add_uint32(f"{arch}.ssm.group_count", ssm["n_k_heads"])
        w.add_uint32(f"{arch}.full_attention_interval", 4)
    w.add_rope_freq_base(cfg["rope_base"])
    gpt_oss = arch == "gpt-oss"
    if gpt_oss:
        w.add_uint32(f"{arch}.attention.sliding_window", 128)
        w.add_string(f"{arch}.rope.scaling.type", "yarn")
        w.add_float32(f"{arch}.rope.scaling.factor", 32.0)
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", 4096)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(2 if a.type == "q4_0" else 15)
    fx.add_vocab(w, vocab)

    e, ff, nl = cfg["n_embd"], cfg["n_ff"], cfg["n_layer"]
    q_dim = cfg["n_head"] * hd
    kv = cfg["n_head_kv"] * hd
    base = Q.Q4_0 if a.type == "q4_0" else Q.Q4_K
    head_type = Q.Q6_K
    if arch == "gpt-oss":
        # Rows of 2880 values fit no K-quant (256-value blocks): the released files keep
        # attention, embedding and head in Q8_0 beside MXFP4 experts, and so does this.
        base = head_type = Q.Q8_0

    def more_bits(il):
        # llama.cpp's use_more_bits: the first and last eighth, and every third layer between.
        return il < nl // 8 or il >= 7 * nl // 8 or (il - nl // 8) % 3 == 2

    shared = {}

    def matrix(name, qtype, shape):
        # With --reuse-layers, blk.N.KIND shares its bytes with every other layer's KIND.
        key = (name.split(".", 2)[-1] if name.startswith("blk.") else name, qtype, tuple(shape))
        data = shared.get(key) if a.reuse_layers else None
        if data is None:
            data = fx.random_blocks(rng, qtype, shape)
            if a.reuse_layers:
                shared[key] = data
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)

    def ones(name, n):
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    matrix("token_embd.weight", base, [e, n_vocab])
    for il in range(nl):
        p = f"blk.{il}."
        ones(p + "attn_norm.weight", e)
        hi = a.type == "q4_k_m" and more_bits(il)
        if ssm and (il + 1) % 4 != 0:
            # A gated delta net layer.
            key_dim = ssm["n_k_heads"] * ssm["head"]
            value_dim = ssm["n_v_heads"] * ssm["head"]
            conv_dim = 2 * key_dim + value_dim
            matrix(p + "attn_qkv.weight", base, [e, conv_dim])
            matrix(p + "attn_gate.weight", base, [e, value_dim])
            w.add_tensor(p + "ssm_conv1d.weight",
                         (rng.standard_normal((conv_dim, ssm["d_conv"])) * 0.3).astype(np.float32))
            w.add_tensor(p + "ssm_dt.bias", np.zeros(ssm["n_v_heads"], dtype=np.float32))
            w.add_tensor(p + "ssm_a", -np.ones(ssm["n_v_heads"], dtype=np.float32))
            matrix(p + "ssm_beta.weight", base, [e, ssm["n_v_heads"]])
            matrix(p + "ssm_alpha.weight", base, [e, ssm["n_v_heads"]])
            ones(p + "ssm_norm.weight", ssm["head"])
            matrix(p + "ssm_out.weight", base, [value_dim, e])
        else:
            # Qwen3.5's attention layers give a query and an output gate per head.
            matrix(p + "attn_q.weight", base, [e, q_dim * (2 if ssm else 1)])
            matrix(p + "attn_k.weight", base, [e, kv])
            matrix(p + "attn_v.weight", Q.Q6_K if hi else base, [e, kv])
            matrix(p + "attn_output.weight", base, [q_dim, e])
            if gpt_oss:
                for name, n_out in (("q", q_dim), ("k", kv), ("v", kv), ("output", e)):
                    w.add_tensor(p + f"attn_{name}.bias", np.zeros(n_out, dtype=np.float32))
                w.add_tensor(p + "attn_sinks.weight", np.zeros(cfg["n_head"], dtype=np.float32))
            if arch in ("qwen3moe", "qwen35moe"):
                ones(p + "attn_q_norm.weight", hd)
                ones(p + "attn_k_norm.weight", hd)
        if ssm or gpt_oss:
            ones(p + "post_attention_norm.weight", e)
        else:
            ones(p + "ffn_norm.weight", e)
        if moe:
            x, eff = moe["n_expert"], moe["n_ff_exp"]
            # The router in F32 (as converters write it), random so that tokens spread over experts.
            w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((x, e)) * 0.05).astype(np.float32))
            if gpt_oss:
                # MXFP4 experts with biases, as the released files have them.
                w.add_tensor(p + "ffn_gate_inp.bias", np.zeros(x, dtype=np.float32))
                for name, shape in (("gate", [e, eff, x]), ("up", [e, eff, x]), ("down", [eff, e, x])):
                    matrix(p + f"ffn_{name}_exps.weight", Q.MXFP4, shape)
                    w.add_tensor(p + f"ffn_{name}_exps.bias", np.zeros((x, shape[1]), dtype=np.float32))
            else:
                matrix(p + "ffn_gate_exps.weight", base, [e, eff, x])
                matrix(p + "ffn_up_exps.weight", base, [e, eff, x])
                matrix(p + "ffn_down_exps.weight", Q.Q6_K if hi else base, [eff, e, x])
            if moe.get("shared_ff"):
                sff = moe["shared_ff"]
                matrix(p + "ffn_gate_shexp.weight", base, [e, sff])
                matrix(p + "ffn_up_shexp.weight", base, [e, sff])
                matrix(p + "ffn_down_shexp.weight", base, [sff, e])
                w.add_tensor(p + "ffn_gate_inp_shexp.weight",
                             (rng.standard_normal(e) * 0.05).astype(np.float32))
        else:
            matrix(p + "ffn_gate.weight", base, [e, ff])
            matrix(p + "ffn_up.weight", base, [e, ff])
            matrix(p + "ffn_down.weight", Q.Q6_K if hi else base, [ff, e])
    ones("output_norm.weight", e)
    matrix("output.weight", head_type, [e, n_vocab])

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    print(f"wrote {a.out}: {os.path.getsize(a.out) / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
