#!/usr/bin/env python3
"""Writes tiny random-weight GGUF fixtures for architectures with no real weights here.

Each fixture has a few layers, a small hidden size, real-looking metadata and the real SmolLM2
byte-level BPE vocabulary (copied from the SmolLM2 GGUF, so tokenization is realistic). Weights are
seeded random values, Q8_0 for matrices (exercising quantized kernels) and F32 for norms/biases.
Tests check our graphs against libllama on these files.

    pip install gguf numpy
    python3 scripts/make-fixtures.py [--smollm2 PATH] [--out fixtures]
"""
import argparse
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

VOCAB_KEYS = [
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.chat_template",
]


def read_vocab(path):
    r = gguf.GGUFReader(path)
    out = {}
    for k in VOCAB_KEYS:
        f = r.fields.get(k)
        if f is None:
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                out[k] = (t, sub, [bytes(f.parts[i]).decode("utf-8") for i in f.data])
            else:
                out[k] = (t, sub, [f.parts[i][0].item() for i in f.data])
        elif t == gguf.GGUFValueType.STRING:
            out[k] = (t, None, bytes(f.parts[f.data[0]]).decode("utf-8"))
        else:
            out[k] = (t, None, f.parts[f.data[0]][0].item())
    return out


def add_vocab(w, vocab):
    for k, (t, sub, v) in vocab.items():
        if t == gguf.GGUFValueType.ARRAY:
            w.add_array(k, v) if sub != gguf.GGUFValueType.INT32 else w.add_array(k, [int(x) for x in v])
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(k, v)
        elif t == gguf.GGUFValueType.BOOL:
            w.add_bool(k, bool(v))
        else:
            w.add_uint32(k, int(v))


# (bytes per block, elements per block, [(f16 field offset, value)]) of the quantized types written
# as random bytes (gguf-py cannot quantize K-quants): the f16 scale fields get a small value so
# that weights come out around +-0.02. MXFP4's scale is one E8M0 byte (a power of two): an int
# value is written as that byte (2^(120-127) halved, so that weights are at most about +-0.05).
BLOCKS = {
    Q.Q4_0: (18, 32, [(0, 0.005)]),
    Q.Q4_K: (144, 256, [(0, 2e-5), (2, 2e-5)]),
    Q.Q6_K: (210, 256, [(208, 5e-6)]),
    Q.MXFP4: (17, 32, [(0, 120)]),
    Q.Q8_0: (34, 32, [(0, 5e-4)]),
}


def random_blocks(rng, qtype, shape):
    """Random quantized data of `shape` (ggml order: row length first) as raw bytes, in numpy
    order (the reverse of ggml's) with rows of bytes last."""
    size, per, fields = BLOCKS[qtype]
    n_el = int(np.prod(shape))
    assert shape[0] % per == 0, (shape, qtype)
    data = rng.integers(0, 256, size=(n_el // per, size), dtype=np.uint8)
    for off, value in fields:
        if isinstance(value, int):
            data[:, off] = value
        else:
            data[:, off:off + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
    return data.reshape(*reversed(shape[1:]), -1) if len(shape) > 1 else data.reshape(1, -1)


class Tensors:
    """Seeded random tensors into a writer: Q8_0 matrices and F32 vectors."""

    def __init__(self, w, rng):
        self.w, self.rng = w, rng

    def quantized(self, name, shape_np, scale, qtype=Q.Q8_0):
        data = (self.rng.standard_normal(shape_np) * scale).astype(np.float32)
        self.w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    def mat(self, name, rows, cols, scale=None, qtype=Q.Q8_0):
        # ggml shape [cols(ne0), rows(ne1)]: numpy array (rows, cols)
        self.quantized(name, (rows, cols), scale if scale is not None else 1.0 / np.sqrt(cols), qtype)

    def vec(self, name, n, center=1.0, scale=0.1):
        self.w.add_tensor(name, (center + self.rng.standard_normal(n) * scale).astype(np.float32))


def writer(path, arch, name, e, nl, ff, nh, nkv, split_max_tensors=0):
    """A GGUF writer with the metadata every fixture has; `split_max_tensors` splits the file into
    parts of that many tensors (`<stem>-00001-of-0000N.gguf`), as llama.cpp's gguf-split does."""
    w = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    w.add_name(name)
    w.add_context_length(4096)
    w.add_embedding_length(e)
    w.add_block_count(nl)
    if isinstance(ff, list):
        w.add_array(f"{arch}.feed_forward_length", ff)
    else:
        w.add_feed_forward_length(ff)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    return w


def add_moe_keys(w, n_expert, n_used, n_ff_exp, shared_ff=None):
    """The expert counts and widths of a mixture-of-experts file."""
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    if shared_ff:
        w.add_expert_shared_feed_forward_length(shared_ff)


def finish(w, path):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if os.path.exists(path):
        print(f"wrote {path} ({os.path.getsize(path) / 1e6:.1f} MB)")
    else:
        print(f"wrote {path} in parts")


def write(path, arch, cfg, vocab, seed, qk_norm=False, qkv_bias=False, extra=None, moe=None,
          embd_type=Q.Q8_0, untied=False, split_max_tensors=0):
    """A Llama-shaped fixture. `moe`: dict(n_expert, n_used, n_ff_exp, shared_ff (or None),
    qtype (of the expert weights)) makes every FFN a mixture of experts."""
    rng = np.random.default_rng(seed)
    n_vocab = len(vocab["tokenizer.ggml.tokens"][2])
    e, nh, nkv, hd, ff, nl = cfg["n_embd"], cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"], cfg["n_ff"], cfg["n_layer"]
    w = writer(path, arch, f"axle-fixture-{arch}", e, nl, ff, nh, nkv, split_max_tensors)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(cfg.get("rope_base", 10000.0))
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    for k, v in (extra or {}).items():
        w.add_uint32(k, v)
    if moe:
        add_moe_keys(w, moe["n_expert"], moe["n_used"], moe["n_ff_exp"], moe.get("shared_ff"))
    add_vocab(w, vocab)

    t = Tensors(w, rng)
    mat, vec = t.mat, t.vec

    def experts(p, e, m):
        x, eff = m["n_expert"], m["n_ff_exp"]
        # The router in F32, as converters write it; larger scale so that routing is decisive.
        w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((x, e)) * 0.5).astype(np.float32))
        for name, shape in (("gate", [e, eff, x]), ("up", [e, eff, x]), ("down", [eff, e, x])):
            if m["qtype"] in BLOCKS:
                data = random_blocks(rng, m["qtype"], shape)
                w.add_tensor(p + f"ffn_{name}_exps.weight", data, raw_shape=data.shape, raw_dtype=m["qtype"])
            else:
                data = (rng.standard_normal(tuple(reversed(shape))) / np.sqrt(shape[0])).astype(np.float32)
                w.add_tensor(p + f"ffn_{name}_exps.weight", gguf.quants.quantize(data, m["qtype"]),
                             raw_dtype=m["qtype"])
        if m.get("shared_ff"):
            sff = m["shared_ff"]
            mat(p + "ffn_gate_shexp.weight", sff, e)
            mat(p + "ffn_up_shexp.weight", sff, e)
            mat(p + "ffn_down_shexp.weight", e, sff)
            vec(p + "ffn_gate_inp_shexp.weight", e, 0.0, 0.5)

    mat("token_embd.weight", n_vocab, e, scale=1.0, qtype=embd_type)
    vec("output_norm.weight", e)
    if untied:
        mat("output.weight", n_vocab, e, qtype=embd_type)
    for i in range(nl):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", e)
        mat(p + "attn_q.weight", nh * hd, e)
        mat(p + "attn_k.weight", nkv * hd, e)
        mat(p + "attn_v.weight", nkv * hd, e)
        mat(p + "attn_output.weight", e, nh * hd)
        if qkv_bias:
            vec(p + "attn_q.bias", nh * hd, 0.0, 0.5)
            vec(p + "attn_k.bias", nkv * hd, 0.0, 0.5)
            vec(p + "attn_v.bias", nkv * hd, 0.0, 0.5)
        if qk_norm:
            vec(p + "attn_q_norm.weight", hd)
            vec(p + "attn_k_norm.weight", hd)
        vec(p + "ffn_norm.weight", e)
        if moe:
            experts(p, e, moe)
        else:
            mat(p + "ffn_gate.weight", ff, e)
            mat(p + "ffn_up.weight", ff, e)
            mat(p + "ffn_down.weight", e, ff)
    finish(w, path)


def write_gemma4(path, vocab, seed, moe=False):
    """A Gemma 4 fixture with the real configs' structure at a tiny size. Dense (E2B/E4B-like):
    6 layers, local/global pattern L L L G L G, local heads of 32 and global heads of 64 (rotated
    through `rope_freqs`, half of them with factor 1 and half left unrotated: proportional RoPE),
    K = V on the global layers (no attn_v), the last 2 layers reusing earlier layers' KV, per-layer
    embeddings of 32, FFN widths per layer (double width on the last two), a 16-token window,
    per-layer output scales, final logit softcapping, an untied head. MoE (26B-A4B-like): 4 layers L L L G, no
    KV sharing or per-layer embeddings, a dense GELU FFN beside 6 experts (top-2, merged gate/up
    weights, per-expert output scales) routed from the scaled residual."""
    rng = np.random.default_rng(seed)
    n_vocab = len(vocab["tokenizer.ggml.tokens"][2])
    arch = "gemma4"
    e, nh, nkv, hd_full, hd_swa, n_pl = 64, 4, 2, 64, 32, 32
    pattern = [True, True, True, False] if moe else [True, True, True, False, True, False]
    nl = len(pattern)
    ffs = [128] * nl if moe else [128, 128, 128, 128, 256, 256]
    shared = 0 if moe else 2
    w = writer(path, arch, f"axle-fixture-{arch}{'-moe' if moe else ''}", e, nl, ffs, nh, nkv)
    w.add_key_length(hd_full)
    w.add_value_length(hd_full)
    w.add_uint32(f"{arch}.attention.key_length_swa", hd_swa)
    w.add_uint32(f"{arch}.attention.value_length_swa", hd_swa)
    w.add_uint32(f"{arch}.rope.dimension_count", hd_full)
    w.add_uint32(f"{arch}.rope.dimension_count_swa", hd_swa)
    w.add_rope_freq_base(1e6)
    w.add_float32(f"{arch}.rope.freq_base_swa", 10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_uint32(f"{arch}.attention.sliding_window", 16)
    w.add_array(f"{arch}.attention.sliding_window_pattern", pattern)
    w.add_uint32(f"{arch}.attention.shared_kv_layers", shared)
    w.add_uint32(f"{arch}.embedding_length_per_layer_input", 0 if moe else n_pl)
    w.add_float32(f"{arch}.final_logit_softcapping", 30.0)
    if moe:
        add_moe_keys(w, 6, 2, 64)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    add_vocab(w, vocab)

    t = Tensors(w, rng)
    mat, vec = t.mat, t.vec

    mat("token_embd.weight", n_vocab, e, scale=1.0)
    mat("output.weight", n_vocab, e)
    vec("output_norm.weight", e)
    # Proportional RoPE of the global layers: the first half of the frequencies rotate, the rest
    # get a huge factor (no rotation), as the converter writes it.
    w.add_tensor("rope_freqs.weight", np.array([1.0] * (hd_full // 4) + [1e30] * (hd_full // 4),
                                                dtype=np.float32))
    if not moe:
        mat("per_layer_token_embd.weight", n_vocab, n_pl * nl, scale=1.0)
        mat("per_layer_model_proj.weight", n_pl * nl, e)
        vec("per_layer_proj_norm.weight", n_pl)
    for i, swa in enumerate(pattern):
        p = f"blk.{i}."
        hd = hd_swa if swa else hd_full
        has_kv = i < nl - shared
        vec(p + "attn_norm.weight", e)
        mat(p + "attn_q.weight", nh * hd, e)
        if has_kv:
            mat(p + "attn_k.weight", nkv * hd, e)
            if swa:
                mat(p + "attn_v.weight", nkv * hd, e)
            vec(p + "attn_k_norm.weight", hd)
        vec(p + "attn_q_norm.weight", hd)
        mat(p + "attn_output.weight", e, nh * hd)
        vec(p + "post_attention_norm.weight", e)
        vec(p + "ffn_norm.weight", e)
        mat(p + "ffn_gate.weight", ffs[i], e)
        mat(p + "ffn_up.weight", ffs[i], e)
        mat(p + "ffn_down.weight", e, ffs[i])
        vec(p + "post_ffw_norm.weight", e)
        w.add_tensor(p + "layer_output_scale.weight", np.array([0.8 + 0.1 * i], dtype=np.float32))
        if moe:
            x, eff = 6, 64
            w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((x, e)) * 0.5).astype(np.float32))
            vec(p + "ffn_gate_inp.scale", e)
            vec(p + "pre_ffw_norm_2.weight", e)
            vec(p + "post_ffw_norm_1.weight", e)
            vec(p + "post_ffw_norm_2.weight", e)
            gu = (rng.standard_normal((x, 2 * eff, e)) / np.sqrt(e)).astype(np.float32)
            w.add_tensor(p + "ffn_gate_up_exps.weight", gguf.quants.quantize(gu, Q.Q8_0), raw_dtype=Q.Q8_0)
            dn = (rng.standard_normal((x, e, eff)) / np.sqrt(eff)).astype(np.float32)
            w.add_tensor(p + "ffn_down_exps.weight", gguf.quants.quantize(dn, Q.Q8_0), raw_dtype=Q.Q8_0)
            vec(p + "ffn_down_exps.scale", x)
        else:
            mat(p + "inp_gate.weight", n_pl, e)
            mat(p + "proj.weight", e, n_pl)
            vec(p + "post_norm.weight", e)
    finish(w, path)


def write_deepseek2(path, vocab, seed, v3=False, mtp=False):
    """A DeepSeek-V3 / GLM-4.7-Flash-style fixture (`deepseek2`): multi-head latent attention
    with a low-rank query (rank 32), a 32-wide KV latent plus 16 rotated dims (one cache row of 48
    per token), heads of 48 (32 unrotated + 16) for keys and 32 for values, split per-head
    up-projections (attn_k_b / attn_v_b); one leading dense layer, then MoE layers with 8 experts,
    top-2, sigmoid routing with a selection bias, renormalised and scaled weights, one shared
    expert. `v3`: DeepSeek-V3/Kimi-K2 style instead: full-rank queries, YaRN-scaled RoPE (factor
    4 over 256 positions, log multiplier 0.1) and grouped expert selection (4 groups of 2, 2 used,
    top-2). `mtp`: one multi-token-prediction block after the trunk (`nextn_predict_layers` = 1,
    as GLM-4.7-Flash files carry): an MoE layer with the `nextn` input projection and norms and a
    head norm of its own."""
    rng = np.random.default_rng(seed)
    n_vocab = len(vocab["tokenizer.ggml.tokens"][2])
    arch = "deepseek2"
    e, nh, nl, ff = 64, 4, 3, 128
    q_lora, kv_lora, rope, nope, hv = (0 if v3 else 32), 32, 16, 32, 32
    x, eff = 8, 64
    w = writer(path, arch, f"axle-fixture-{arch}", e, nl + int(mtp), ff, nh, 1)
    if mtp:
        w.add_uint32(f"{arch}.nextn_predict_layers", 1)
    w.add_key_length(kv_lora + rope)
    w.add_value_length(kv_lora)
    w.add_uint32(f"{arch}.attention.key_length_mla", nope + rope)
    w.add_uint32(f"{arch}.attention.value_length_mla", hv)
    w.add_uint32(f"{arch}.attention.q_lora_rank", q_lora)
    w.add_uint32(f"{arch}.attention.kv_lora_rank", kv_lora)
    w.add_uint32(f"{arch}.rope.dimension_count", rope)
    w.add_rope_freq_base(10000.0)
    if v3:
        w.add_string(f"{arch}.rope.scaling.type", "yarn")
        w.add_float32(f"{arch}.rope.scaling.factor", 4.0)
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", 256)
        w.add_float32(f"{arch}.rope.scaling.yarn_log_multiplier", 0.1)
        w.add_uint32(f"{arch}.expert_group_count", 4)
        w.add_uint32(f"{arch}.expert_group_used_count", 2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_uint32(f"{arch}.leading_dense_block_count", 1)
    add_moe_keys(w, x, 2, eff)
    w.add_uint32(f"{arch}.expert_shared_count", 1)
    w.add_float32(f"{arch}.expert_weights_scale", 2.5)
    w.add_bool(f"{arch}.expert_weights_norm", True)
    w.add_uint32(f"{arch}.expert_gating_func", 2)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    add_vocab(w, vocab)

    t = Tensors(w, rng)
    q8, mat, vec = t.quantized, t.mat, t.vec

    mat("token_embd.weight", n_vocab, e, scale=1.0)
    mat("output.weight", n_vocab, e)
    vec("output_norm.weight", e)
    for i in range(nl + int(mtp)):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", e)
        if i == nl:
            nextn_block(t, p, e)
        if q_lora:
            mat(p + "attn_q_a.weight", q_lora, e)
            vec(p + "attn_q_a_norm.weight", q_lora)
            mat(p + "attn_q_b.weight", nh * (nope + rope), q_lora)
        else:
            mat(p + "attn_q.weight", nh * (nope + rope), e)
        mat(p + "attn_kv_a_mqa.weight", kv_lora + rope, e)
        vec(p + "attn_kv_a_norm.weight", kv_lora)
        q8(p + "attn_k_b.weight", (nh, kv_lora, nope), 1.0 / np.sqrt(nope))
        q8(p + "attn_v_b.weight", (nh, hv, kv_lora), 1.0 / np.sqrt(kv_lora))
        mat(p + "attn_output.weight", e, nh * hv)
        vec(p + "ffn_norm.weight", e)
        if i == 0:
            mat(p + "ffn_gate.weight", ff, e)
            mat(p + "ffn_up.weight", ff, e)
            mat(p + "ffn_down.weight", e, ff)
            continue
        w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((x, e)) * 0.5).astype(np.float32))
        vec(p + "exp_probs_b.bias", x, 0.0, 0.3)
        q8(p + "ffn_gate_exps.weight", (x, eff, e), 1.0 / np.sqrt(e))
        q8(p + "ffn_up_exps.weight", (x, eff, e), 1.0 / np.sqrt(e))
        q8(p + "ffn_down_exps.weight", (x, e, eff), 1.0 / np.sqrt(eff))
        mat(p + "ffn_gate_shexp.weight", eff, e)
        mat(p + "ffn_up_shexp.weight", eff, e)
        mat(p + "ffn_down_shexp.weight", e, eff)
    finish(w, path)


def write_qwen35(path, vocab, seed, moe=False, tied=False, next_=False, mtp=False):
    """A Qwen3.5 fixture (`qwen35`, or `qwen35moe` with routed experts and a gated shared
    expert): 4 layers, three gated delta net layers (2 key heads and 4 value heads of 16, a 4-tap
    convolution) then one gated full-attention layer (4 query / 2 KV heads of 32, 16 rotated dims
    in interleaved M-RoPE sections 3/3/2/0), an untied head. `tied`: the embedding as the head,
    which makes the random model repeat itself, so that n-gram drafts get both accepted and
    rejected in engine tests. `next_`: Qwen3-Next (`qwen3next`, MoE): NeoX RoPE and one fused
    beta/decay projection (`ssm_ba`). `mtp`: one multi-token-prediction block after the trunk
    (`nextn_predict_layers` = 1): a gated full-attention layer with the trunk's FFN kind, the
    `nextn` input projection and norms, and a head norm of its own."""
    rng = np.random.default_rng(seed)
    n_vocab = len(vocab["tokenizer.ggml.tokens"][2])
    arch = "qwen3next" if next_ else "qwen35moe" if moe else "qwen35"
    moe = moe or next_
    e, nh, nkv, hd, ff, nl = 64, 4, 2, 32, 128, 4
    d_conv, hk, n_kh, n_vh = 4, 16, 2, 4
    key_dim, value_dim = hk * n_kh, hk * n_vh
    conv_dim = 2 * key_dim + value_dim
    w = writer(path, arch, f"axle-fixture-{arch}", e, nl + int(mtp), ff, nh, nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    if mtp:
        w.add_uint32(f"{arch}.nextn_predict_layers", 1)
    w.add_uint32(f"{arch}.rope.dimension_count", 16)
    if not next_:
        w.add_array(f"{arch}.rope.dimension_sections", [3, 3, 2, 0])
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_uint32(f"{arch}.ssm.conv_kernel", d_conv)
    w.add_uint32(f"{arch}.ssm.inner_size", value_dim)
    w.add_uint32(f"{arch}.ssm.state_size", hk)
    w.add_uint32(f"{arch}.ssm.time_step_rank", n_vh)
    w.add_uint32(f"{arch}.ssm.group_count", n_kh)
    w.add_uint32(f"{arch}.full_attention_interval", 4)
    if moe:
        add_moe_keys(w, 6, 2, 64, 96)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    add_vocab(w, vocab)

    t = Tensors(w, rng)
    mat, vec = t.mat, t.vec

    mat("token_embd.weight", n_vocab, e, scale=1.0)
    if not tied:
        mat("output.weight", n_vocab, e)
    vec("output_norm.weight", e)
    for i in range(nl + int(mtp)):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", e)
        vec(p + "post_attention_norm.weight", e)
        if i == nl:
            nextn_block(t, p, e)
        if (i + 1) % 4 != 0 and i < nl:
            mat(p + "attn_qkv.weight", conv_dim, e)
            mat(p + "attn_gate.weight", value_dim, e)
            w.add_tensor(p + "ssm_conv1d.weight", (rng.standard_normal((conv_dim, d_conv)) * 0.5).astype(np.float32))
            # Slow decays (per token, exp(-softplus(alpha + dt) * exp(A_log)) near 0.99): the state
            # remembers far back, so that a wrong starting state shows in the logits.
            vec(p + "ssm_dt.bias", n_vh, -2.0, 0.5)
            w.add_tensor(p + "ssm_a", (-np.exp(rng.standard_normal(n_vh) * 0.5 - 4.0)).astype(np.float32))
            if next_:
                mat(p + "ssm_ba.weight", 2 * n_vh, e)
            else:
                mat(p + "ssm_beta.weight", n_vh, e)
                mat(p + "ssm_alpha.weight", n_vh, e)
            vec(p + "ssm_norm.weight", hk)
            mat(p + "ssm_out.weight", e, value_dim)
        else:
            mat(p + "attn_q.weight", 2 * hd * nh, e)
            mat(p + "attn_k.weight", hd * nkv, e)
            mat(p + "attn_v.weight", hd * nkv, e)
            mat(p + "attn_output.weight", e, hd * nh)
            vec(p + "attn_q_norm.weight", hd)
            vec(p + "attn_k_norm.weight", hd)
        if moe:
            x, eff = 6, 64
            w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((x, e)) * 0.5).astype(np.float32))
            for name, shape in (("gate", (x, eff, e)), ("up", (x, eff, e)), ("down", (x, e, eff))):
                data = (rng.standard_normal(shape) / np.sqrt(shape[2])).astype(np.float32)
                w.add_tensor(p + f"ffn_{name}_exps.weight", gguf.quants.quantize(data, Q.Q8_0), raw_dtype=Q.Q8_0)
            mat(p + "ffn_gate_shexp.weight", 96, e)
            mat(p + "ffn_up_shexp.weight", 96, e)
            mat(p + "ffn_down_shexp.weight", e, 96)
            vec(p + "ffn_gate_inp_shexp.weight", e, 0.0, 0.5)
        else:
            mat(p + "ffn_gate.weight", ff, e)
            mat(p + "ffn_up.weight", ff, e)
            mat(p + "ffn_down.weight", e, ff)
    finish(w, path)


# Files main() writes (setup-tests.sh regenerates them when some are missing).
def nextn_block(t, p, e):
    """An MTP block's own tensors (`nextn.*`): the input projection, its two norms, a head norm."""
    t.mat(p + "nextn.eh_proj.weight", e, 2 * e)
    t.vec(p + "nextn.enorm.weight", e)
    t.vec(p + "nextn.hnorm.weight", e)
    t.vec(p + "nextn.shared_head_norm.weight", e)


def biased_attention(t, p, e, nh, nkv, hd):
    """A layer's attention norm, Q/K/V projections with biases and output projection."""
    t.vec(p + "attn_norm.weight", e)
    for name, rows in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
        t.mat(p + f"attn_{name}.weight", rows, e)
        t.vec(p + f"attn_{name}.bias", rows, 0.0, 0.5)
    t.mat(p + "attn_output.weight", e, nh * hd)


def write_gpt_oss(path, vocab, seed):
    """gpt-oss: 4 layers alternating sliding-window (16) and global attention, QKV and output
    biases, per-head attention sinks, YaRN RoPE (factor 32 over 4096, as the released files),
    4 MXFP4 experts of which each token uses 2, with router and per-expert biases. SmolLM2's
    vocabulary with gpt-oss's pre-tokenizer (`gpt-4o`, o200k's regex), which the tokenizer test
    checks against libllama."""
    rng = np.random.default_rng(seed)
    arch = "gpt-oss"
    n_vocab = len(vocab["tokenizer.ggml.tokens"][2])
    e, nl, nh, nkv, hd, x, used, eff = 64, 4, 4, 2, 16, 4, 2, 64
    w = writer(path, arch, "axle-fixture-gpt-oss", e, nl, eff, nh, nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(150000.0)
    w.add_string(f"{arch}.rope.scaling.type", "yarn")
    w.add_float32(f"{arch}.rope.scaling.factor", 32.0)
    w.add_uint32(f"{arch}.rope.scaling.original_context_length", 4096)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_uint32(f"{arch}.attention.sliding_window", 16)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    add_moe_keys(w, x, used, eff)
    t_pre, _, _ = vocab["tokenizer.ggml.pre"]
    add_vocab(w, dict(vocab, **{"tokenizer.ggml.pre": (t_pre, None, "gpt-4o")}))
    t = Tensors(w, rng)
    mat, vec = t.mat, t.vec
    mat("token_embd.weight", n_vocab, e, scale=1.0)
    vec("output_norm.weight", e)
    mat("output.weight", n_vocab, e)
    for i in range(nl):
        p = f"blk.{i}."
        biased_attention(t, p, e, nh, nkv, hd)
        vec(p + "attn_output.bias", e, 0.0, 0.1)
        vec(p + "attn_sinks.weight", nh, 0.0, 1.0)
        vec(p + "post_attention_norm.weight", e)
        w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((x, e)) * 0.5).astype(np.float32))
        vec(p + "ffn_gate_inp.bias", x, 0.0, 0.5)
        for name, shape in (("gate", [e, eff, x]), ("up", [e, eff, x]), ("down", [eff, e, x])):
            data = random_blocks(rng, Q.MXFP4, shape)
            w.add_tensor(p + f"ffn_{name}_exps.weight", data, raw_shape=data.shape, raw_dtype=Q.MXFP4)
            out = shape[1]
            w.add_tensor(p + f"ffn_{name}_exps.bias",
                         (rng.standard_normal((x, out)) * 0.1).astype(np.float32))
    finish(w, path)


def write_glm4moe(path, vocab, seed):
    """GLM-4.5: 3 trunk layers and 1 multi-token-prediction layer (`nextn`, loaded, not run);
    QKV biases, QK norm, partial NeoX RoPE (16 of 32 dims); layer 0 dense, layers 1-2 with 6
    sigmoid-routed experts (selection bias, top-2 renormalised, scaled by 2.5) and one ungated
    shared expert."""
    rng = np.random.default_rng(seed)
    arch = "glm4moe"
    n_vocab = len(vocab["tokenizer.ggml.tokens"][2])
    e, nl, nh, nkv, hd, ff, x, used, eff = 64, 4, 4, 2, 32, 128, 6, 2, 64
    w = writer(path, arch, "axle-fixture-glm4moe", e, nl, ff, nh, nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd // 2)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    add_moe_keys(w, x, used, eff)
    w.add_uint32(f"{arch}.expert_shared_count", 1)
    w.add_uint32(f"{arch}.leading_dense_block_count", 1)
    w.add_bool(f"{arch}.expert_weights_norm", True)
    w.add_float32(f"{arch}.expert_weights_scale", 2.5)
    w.add_uint32(f"{arch}.expert_gating_func", 2)
    w.add_uint32(f"{arch}.nextn_predict_layers", 1)
    add_vocab(w, vocab)
    t = Tensors(w, rng)
    mat, vec = t.mat, t.vec
    mat("token_embd.weight", n_vocab, e, scale=1.0)
    vec("output_norm.weight", e)
    mat("output.weight", n_vocab, e)
    for i in range(nl):
        p = f"blk.{i}."
        biased_attention(t, p, e, nh, nkv, hd)
        vec(p + "attn_q_norm.weight", hd)
        vec(p + "attn_k_norm.weight", hd)
        vec(p + "post_attention_norm.weight", e)
        if i == 0:
            mat(p + "ffn_gate.weight", ff, e)
            mat(p + "ffn_up.weight", ff, e)
            mat(p + "ffn_down.weight", e, ff)
            continue
        w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((x, e)) * 0.5).astype(np.float32))
        vec(p + "exp_probs_b.bias", x, 0.0, 0.2)
        for name, shape in (("gate", (x, eff, e)), ("up", (x, eff, e)), ("down", (x, e, eff))):
            data = (rng.standard_normal(shape) / np.sqrt(shape[2])).astype(np.float32)
            w.add_tensor(p + f"ffn_{name}_exps.weight", gguf.quants.quantize(data, Q.Q8_0), raw_dtype=Q.Q8_0)
        mat(p + "ffn_gate_shexp.weight", eff, e)
        mat(p + "ffn_up_shexp.weight", eff, e)
        mat(p + "ffn_down_shexp.weight", e, eff)
        if i == nl - 1:
            nextn_block(t, p, e)
    finish(w, path)


# Files written (the split llama fixture counts its two parts).
FIXTURES = 22


def main():
    ap = argparse.ArgumentParser()
    default = os.path.join(os.environ.get("AXLE_MODEL_DIR", os.path.expanduser("~/.cache/axle/models")),
                           "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--smollm2", default=default)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "fixtures"))
    ap.add_argument("--count", action="store_true", help="print how many fixtures this writes")
    a = ap.parse_args()
    if a.count:
        print(FIXTURES)
        return
    os.makedirs(a.out, exist_ok=True)
    vocab = read_vocab(a.smollm2)
    base = dict(n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, n_layer=2)
    write(os.path.join(a.out, "qwen2-tiny.gguf"), "qwen2", base, vocab, 1, qkv_bias=True)
    write(os.path.join(a.out, "qwen3-tiny.gguf"), "qwen3", dict(base, head_dim=32, rope_base=1e6), vocab, 2, qk_norm=True)
    # An embedding model's file: Qwen3-Embedding's shape, with the last-token pooling its GGUFs
    # name.
    write(os.path.join(a.out, "qwen3-embedding-tiny.gguf"), "qwen3", dict(base, head_dim=32, rope_base=1e6),
          vocab, 17, qk_norm=True, extra={"qwen3.pooling_type": 3})
    write(os.path.join(a.out, "llama-tiny.gguf"), "llama", base, vocab, 3)
    # The same weights split into two files (llama-split-tiny-0000{1,2}-of-00002.gguf).
    write(os.path.join(a.out, "llama-split-tiny.gguf"), "llama", base, vocab, 3, split_max_tensors=12)
    # Mistral-style: every layer attends over a sliding window. One layer, so that the last token's
    # logits over a long prompt equal a full-attention run over just the last `window` tokens.
    write(os.path.join(a.out, "mistral-swa-tiny.gguf"), "llama", dict(base, n_layer=1), vocab, 4,
          extra={"llama.attention.sliding_window": 16})
    # Mixtures of experts (and Gemma 4 below) with their own output matrix: a random tied head
    # makes a random model repeat one token, which tests little. Qwen3-MoE: 8 experts, top-2, renormalised, K-quant experts (Q4_K, as in
    # the Q4_K_M files people download: ggml's tiled kernel applies to them from 8 rows per
    # expert, which batch invariance has to avoid), hidden 256 (a Q4_K row is 256 values).
    write(os.path.join(a.out, "qwen3moe-tiny.gguf"), "qwen3moe",
          dict(base, n_embd=256, head_dim=64, n_ff=512, rope_base=1e6), vocab, 5, qk_norm=True,
          moe=dict(n_expert=8, n_used=2, n_ff_exp=256, qtype=Q.Q4_K), embd_type=Q.Q4_0, untied=True)
    # Qwen2-MoE: 6 experts, top-2, unnormalised, Q8_0, a gated shared expert.
    # (libllama requires its own output matrix.)
    write(os.path.join(a.out, "qwen2moe-tiny.gguf"), "qwen2moe", base, vocab, 6, qkv_bias=True,
          moe=dict(n_expert=6, n_used=2, n_ff_exp=64, shared_ff=96, qtype=Q.Q8_0), untied=True)
    write_gemma4(os.path.join(a.out, "gemma4-tiny.gguf"), vocab, 7)
    write_gemma4(os.path.join(a.out, "gemma4moe-tiny.gguf"), vocab, 8, moe=True)
    write_deepseek2(os.path.join(a.out, "deepseek2-tiny.gguf"), vocab, 9)
    write_deepseek2(os.path.join(a.out, "deepseek2-v3-tiny.gguf"), vocab, 14, v3=True)
    write_qwen35(os.path.join(a.out, "qwen35-tiny.gguf"), vocab, 10)
    write_qwen35(os.path.join(a.out, "qwen35moe-tiny.gguf"), vocab, 11, moe=True)
    write_qwen35(os.path.join(a.out, "qwen35-tied-tiny.gguf"), vocab, 12, tied=True)
    write_qwen35(os.path.join(a.out, "qwen3next-tiny.gguf"), vocab, 13, next_=True)
    write_gpt_oss(os.path.join(a.out, "gpt-oss-tiny.gguf"), vocab, 15)
    write_glm4moe(os.path.join(a.out, "glm4moe-tiny.gguf"), vocab, 16)
    write_qwen35(os.path.join(a.out, "qwen35-mtp-tiny.gguf"), vocab, 17, mtp=True)
    write_deepseek2(os.path.join(a.out, "deepseek2-mtp-tiny.gguf"), vocab, 19, mtp=True)
    write_qwen35(os.path.join(a.out, "qwen35moe-mtp-tiny.gguf"), vocab, 18, moe=True, mtp=True)


if __name__ == "__main__":
    main()
