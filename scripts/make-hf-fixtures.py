#!/usr/bin/env python3
"""Writes Hugging Face safetensors folders from the random-weight GGUF fixtures, each beside a GGUF
twin holding the same numbers, so that tests can check a folder loads as exactly the model its
twin is:

    fixtures/hf/<name>-<dtype>/   config.json, tokenizer.json, tokenizer_config.json,
                                  model-0000{1,2}-of-00002.safetensors + index
    fixtures/hf/<name>-<dtype>.gguf

The weights are the fixture's, dequantized and rounded to the folder's type (f32 or bf16; norms
stay f32 in the twin, as GGUF stores them), under Transformers' names, with the llama family's Q
and K rows put back in rotate-half order (the inverse of llama.cpp's permutation). The tokenizer
is the fixture's SmolLM2 vocabulary as a tokenizer.json, with one of three pre-tokenizers:
SmolLM2's own (digits, then GPT-2's regex), Qwen2's or Llama 3's (a Split regex; Llama 3's with
ignore_merges); the twin names the same one to libllama-style `tokenizer.ggml.pre`.

    python3 scripts/make-hf-fixtures.py [--fixtures fixtures]
"""
import argparse
import json
import os
import struct

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

# (source fixture, folder name, model_type, dtype, tokenizer style)
FOLDERS = [
    ("llama-tiny.gguf", "llama-f32", "llama", "F32", "smollm"),
    ("llama-tiny.gguf", "llama-bf16", "llama", "BF16", "smollm"),
    ("qwen3-tiny.gguf", "qwen3-bf16", "qwen3", "BF16", "qwen2"),
    ("qwen2-tiny.gguf", "qwen2-f32", "qwen2", "F32", "llama3"),
    ("qwen3moe-tiny.gguf", "qwen3moe-bf16", "qwen3_moe", "BF16", "qwen2"),
    # Qwen 3.5 as its checkpoints are: the dense one a vision-language folder (text_config,
    # model.language_model.*, a vision tower and MTP weights beside), the MoE one text only with
    # Transformers' fused experts.
    ("qwen35-tiny.gguf", "qwen35-bf16", "qwen3_5", "BF16", "qwen2"),
    ("qwen35moe-tiny.gguf", "qwen35moe-bf16", "qwen3_5_moe", "BF16", "qwen2"),
    ("qwen35moe-tiny.gguf", "qwen35moe-f32", "qwen3_5_moe", "F32", "qwen2"),
    # Qwen3-Next: queries, keys, values and gates fused per key head, experts one by one.
    ("qwen3next-tiny.gguf", "qwen3next-bf16", "qwen3_next", "BF16", "qwen2"),
    ("qwen3next-tiny.gguf", "qwen3next-f32", "qwen3_next", "F32", "qwen2"),
    # Latent attention: GLM-4.7-Flash (low-rank queries, sigmoid routing with a selection bias, an
    # MTP layer beside) and DeepSeek V3 (full queries, expert groups, YaRN).
    ("deepseek2-tiny.gguf", "glm4lite-bf16", "glm4_moe_lite", "BF16", "qwen2"),
    ("deepseek2-v3-tiny.gguf", "deepseekv3-f32", "deepseek_v3", "F32", "qwen2"),
    # gpt-oss as OpenAI's checkpoints are: MXFP4 experts (blocks and exponents, gate and up rows
    # interleaved), everything else bf16; the twin keeps the fixture's MXFP4 bytes.
    ("gpt-oss-tiny.gguf", "gptoss-mxfp4", "gpt_oss", "BF16", "qwen2"),
    # Gemma 4 (E2B/E4B-like): local and global layers of their own head sizes, K = V on the
    # global ones, KV shared by the last two, per-layer embeddings, double-width FFNs; the
    # proportional RoPE's factors are the loader's to make (the twin keeps the fixture's).
    ("gemma4-tiny.gguf", "gemma4-bf16", "gemma4_text", "BF16", "smollm"),
    # Gemma 4 26B-A4B-like: a dense FFN beside experts (gate and up rows stacked in one tensor),
    # the router's input and per-expert scales.
    ("gemma4moe-tiny.gguf", "gemma4moe-bf16", "gemma4_text", "BF16", "smollm"),
    # The real Gemma 3 270M (from the models cache, not the fixtures), with its SentencePiece
    # vocabulary as a byte-fallback BPE tokenizer.json, as Gemma's folders hold it.
    ("models:gemma-3-270m-q4_k_m.gguf", "gemma3-bf16", "gemma3_text", "BF16", "spm"),
]

QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
GGUF_PRE = {"smollm": "smollm", "qwen2": "qwen2", "llama3": "llama-bpe", "spm": "default"}

TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
       "output.weight": "lm_head.weight", "per_layer_token_embd.weight": "model.embed_tokens_per_layer.weight",
       "per_layer_model_proj.weight": "model.per_layer_model_projection.weight",
       "per_layer_proj_norm.weight": "model.per_layer_projection_norm.weight"}
LAYER = {"attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
         "attn_q.bias": "self_attn.q_proj.bias", "attn_k.weight": "self_attn.k_proj.weight",
         "attn_k.bias": "self_attn.k_proj.bias", "attn_v.weight": "self_attn.v_proj.weight",
         "attn_v.bias": "self_attn.v_proj.bias", "attn_output.weight": "self_attn.o_proj.weight",
         "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
         "ffn_norm.weight": "post_attention_layernorm.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
         "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
         "ffn_gate_inp.weight": "mlp.gate.weight"}
# Qwen 3.5's own: the gated delta net layers' weights and the shared expert.
QWEN35_LAYER = {"attn_qkv.weight": "linear_attn.in_proj_qkv.weight", "attn_gate.weight": "linear_attn.in_proj_z.weight",
                "ssm_beta.weight": "linear_attn.in_proj_b.weight", "ssm_alpha.weight": "linear_attn.in_proj_a.weight",
                "ssm_a": "linear_attn.A_log", "ssm_dt.bias": "linear_attn.dt_bias",
                "ssm_conv1d.weight": "linear_attn.conv1d.weight", "ssm_norm.weight": "linear_attn.norm.weight",
                "ssm_out.weight": "linear_attn.out_proj.weight",
                "post_attention_norm.weight": "post_attention_layernorm.weight",
                "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
                "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
                "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
                "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
                "ssm_ba.weight": "linear_attn.in_proj_ba.weight"}
QWEN35 = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
# Latent attention's own.
MLA_LAYER = {"attn_q_a.weight": "self_attn.q_a_proj.weight", "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
             "attn_q_b.weight": "self_attn.q_b_proj.weight",
             "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
             "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
             "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
             "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
             "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
             "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight"}
MLA = ("glm4_moe_lite", "deepseek_v3")
# Gemma 4's own (beside Gemma's norms).
GEMMA4_LAYER = {"inp_gate.weight": "per_layer_input_gate.weight", "proj.weight": "per_layer_projection.weight",
                "post_norm.weight": "post_per_layer_input_norm.weight", "layer_output_scale.weight": "layer_scalar",
                "ffn_gate_inp.weight": "router.proj.weight", "ffn_gate_inp.scale": "router.scale",
                "ffn_down_exps.scale": "router.per_expert_scale", "ffn_gate_up_exps.weight": "experts.gate_up_proj",
                "ffn_down_exps.weight": "experts.down_proj", "pre_ffw_norm_2.weight": "pre_feedforward_layernorm_2.weight",
                "post_ffw_norm_1.weight": "post_feedforward_layernorm_1.weight",
                "post_ffw_norm_2.weight": "post_feedforward_layernorm_2.weight"}
# gpt-oss's own.
OSS_LAYER = {"post_attention_norm.weight": "post_attention_layernorm.weight", "attn_sinks.weight": "self_attn.sinks",
             "attn_output.bias": "self_attn.o_proj.bias", "ffn_gate_inp.weight": "mlp.router.weight",
             "ffn_gate_inp.bias": "mlp.router.bias"}


def oss_blocks(raw):
    """ggml MXFP4 bytes [experts, rows, blocks * 17] as OpenAI's checkpoints hold them: blocks
    [experts, rows, blocks, 16] (value 2k in byte k's low nibble, 2k + 1 in its high one) and
    exponents [experts, rows, blocks]."""
    e, rows = raw.shape[0], raw.shape[1]
    blk = raw.reshape(e, rows, -1, 17)
    qs = blk[..., 1:]
    values = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8), np.ascontiguousarray(blk[..., 0])


def interleaved(gate, up):
    """Gate and up rows (axis 1) as gpt-oss's gate_up_proj holds them: gate rows even, up odd."""
    out = np.empty((gate.shape[0], 2 * gate.shape[1], *gate.shape[2:]), dtype=gate.dtype)
    out[:, 0::2], out[:, 1::2] = gate, up
    return out


def hf_names(name, w, gemma=False):
    """(Transformers name, array) pairs of one GGUF tensor: experts' weights (`*_exps`, stacked
    in a GGUF) one by one, as Transformers writes them."""
    if name.endswith("_exps.weight"):
        _, layer, rest = name.split(".", 2)
        proj = rest.split("_")[1]
        return [(f"model.layers.{layer}.mlp.experts.{e}.{proj}_proj.weight", w[e]) for e in range(w.shape[0])]
    return [(hf_name(name, gemma), w)]


GEMMA_LAYER = {"post_attention_norm.weight": "post_attention_layernorm.weight",
               "ffn_norm.weight": "pre_feedforward_layernorm.weight",
               "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}


def hf_name(name, gemma=False, extra=None):
    if name in TOP:
        return TOP[name]
    _, layer, rest = name.split(".", 2)
    return f"model.layers.{layer}.{(GEMMA_LAYER.get(rest) if gemma else None) or (extra or {}).get(rest) or LAYER[rest]}"


def grouped(x, axis, k_heads, head):
    """Qwen 3.5's value heads from GGUF's tiled order (value head r of every key head, then r + 1)
    back to Transformers' grouped one (a key head's value heads together)."""
    x = np.moveaxis(x, axis, 0)
    n = x.shape[0]
    out = x.reshape(n // (k_heads * head), k_heads, head, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)
    return np.moveaxis(out, 0, axis)


def qwen35_part(name, w, key, tiled=True):
    """One Qwen 3.5 (or, not `tiled`, Qwen3-Next) GGUF tensor as Transformers holds it: (folder
    array, twin array). Value heads grouped by key head (Qwen3-Next's GGUF has them so already),
    the decay as A_log (f32 in the folder; the twin the f32 of -exp of it in f64, as a reader
    computes it), the convolution [channels, 1, taps], the shared expert's gate [1, n_embd]."""
    nk, hk = key("ssm.group_count"), key("ssm.state_size")
    nv = key("ssm.time_step_rank")
    hv = key("ssm.inner_size") // nv
    if not tiled:
        nk = nv
    qk = 2 * nk * hk
    kind = name.split(".", 2)[-1]
    if kind in ("attn_qkv.weight", "ssm_conv1d.weight"):
        hf = np.concatenate([w[:qk], grouped(w[qk:], 0, nk, hv)])
        return (hf[:, None, :] if kind == "ssm_conv1d.weight" else hf), w
    if kind == "attn_gate.weight":
        return grouped(w, 0, nk, hv), w
    if kind in ("ssm_beta.weight", "ssm_alpha.weight", "ssm_dt.bias"):
        return grouped(w, 0, nk, 1), w
    if kind == "ssm_a":
        a_log = np.log(-grouped(w, 0, nk, 1).astype(np.float64)).astype(np.float32)
        back = (-np.exp(a_log.astype(np.float64))).astype(np.float32)
        return a_log, back[np.argsort(grouped(np.arange(nv), 0, nk, 1))]
    if kind == "ssm_out.weight":
        return grouped(w, 1, nk, hv), w
    if kind == "ffn_gate_inp_shexp.weight":
        return w.reshape(1, -1), w
    return w, w


def field(r, key):
    f = r.fields.get(key)
    if f is None:
        return None
    t = f.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i][0].item() for i in f.data]
    if t == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]][0].item()


def bf16_bits(x):
    """f32 -> bf16 bits, rounding to nearest even."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors):
    """A safetensors file: 8-byte header length, JSON header, data (name -> (dtype, shape, bytes))."""
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def spm_tokenizer_json(tokens, kinds, scores, unk):
    """A SentencePiece vocabulary (tokens with scores) as the byte-fallback BPE tokenizer.json
    Gemma's folders hold: each token of two or more characters made by every merge of two
    vocabulary pieces that spell it, merges ranked by the made token's score (highest first)."""
    ids = {t: i for i, t in enumerate(tokens)}
    merges = []
    for i, t in enumerate(tokens):
        if kinds[i] != 1 or len(t) < 2:
            continue
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            if a in ids and b in ids and kinds[ids[a]] == 1 and kinds[ids[b]] in (1, 6):
                merges.append((-scores[i], i, ids[a], a, b))
    merges.sort()
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": k == 3}
             for i, (t, k) in enumerate(zip(tokens, kinds)) if k in (3, 4)]
    bos = "<bos>"
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        # As Transformers writes Gemma's: a split at spaces, which the normalizer leaves none of.
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                          "invert": False},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {bos: {"id": bos, "ids": [ids[bos]], "tokens": [bos]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
                  "ignore_merges": False, "vocab": ids, "merges": [[a, b] for *_, a, b in merges]},
    }


def tokenizer_json(tokens, kinds, merges, style):
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": k == 3}
             for i, (t, k) in enumerate(zip(tokens, kinds)) if k in (3, 4)]
    if style == "smollm":
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    else:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2 if style == "qwen2" else LLAMA3},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": pre,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": style == "llama3",
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [m.split(" ", 1) for m in merges]},
    }


def write_folder(src, out_dir, name, model_type, dtype, style):
    r = gguf.GGUFReader(src)
    arch = field(r, "general.architecture")
    key = lambda k: field(r, f"{arch}.{k}")
    n_head, n_kv = key("attention.head_count"), key("attention.head_count_kv")
    n_embd = key("embedding_length")
    head_dim = key("attention.key_length") or n_embd // n_head
    tokens = field(r, "tokenizer.ggml.tokens")
    kinds = field(r, "tokenizer.ggml.token_type")
    merges = field(r, "tokenizer.ggml.merges")
    gemma = model_type == "gemma3_text"
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)

    twin = gguf.GGUFWriter(os.path.join(out_dir, f"{name}.gguf"), arch)
    for f in r.fields.values():
        k = f.name
        if k.startswith("GGUF.") or k == "general.architecture" or k == "tokenizer.ggml.pre":
            continue
        v = field(r, k)
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            twin.add_array(k, v)
        elif t == gguf.GGUFValueType.STRING:
            twin.add_string(k, v)
        elif t == gguf.GGUFValueType.BOOL:
            twin.add_bool(k, bool(v))
        elif t in (gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.FLOAT64):
            twin.add_float32(k, float(v))
        else:
            twin.add_uint32(k, int(v))
    twin.add_string("tokenizer.ggml.pre", GGUF_PRE[style])

    shards = [{}, {}]
    tied = True
    qwen35 = model_type in QWEN35
    experts = {}
    for i, t in enumerate(r.tensors):
        if model_type == "gpt_oss" and "_exps." in t.name:
            # The experts: MXFP4 bytes kept (the twin's are the fixture's), biases bf16 in the
            # folder and the same values in f32 in the twin; gate and up written together.
            layer, kind = t.name.split(".")[1], t.name.split(".")[2].split("_")[1]
            part = experts.setdefault(layer, {})
            if t.name.endswith(".weight"):
                raw = np.asarray(t.data, dtype=np.uint8)
                twin.add_tensor(t.name, raw, raw_dtype=Q.MXFP4)
                part[kind] = oss_blocks(raw)
            else:
                b = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
                b = b.reshape([int(d) for d in reversed(t.shape)])
                twin.add_tensor(t.name, (bf16_bits(b).astype(np.uint32) << 16).view(np.float32))
                part[kind + "_bias"] = b
            stem = f"model.layers.{layer}.mlp.experts."
            out = shards[i % 2]
            if kind == "down" and t.name.endswith(".weight"):
                out[stem + "down_proj_blocks"] = ("U8", part["down"][0].shape, part["down"][0].tobytes())
                out[stem + "down_proj_scales"] = ("U8", part["down"][1].shape, part["down"][1].tobytes())
            elif kind == "down":
                out[stem + "down_proj_bias"] = ("BF16", b.shape, bf16_bits(b).tobytes())
            elif t.name.endswith(".weight") and {"gate", "up"} <= part.keys():
                blocks = interleaved(part["gate"][0], part["up"][0])
                scales = interleaved(part["gate"][1], part["up"][1])
                out[stem + "gate_up_proj_blocks"] = ("U8", blocks.shape, blocks.tobytes())
                out[stem + "gate_up_proj_scales"] = ("U8", scales.shape, scales.tobytes())
            elif t.name.endswith(".bias") and {"gate_bias", "up_bias"} <= part.keys():
                both = interleaved(part["gate_bias"], part["up_bias"])
                out[stem + "gate_up_proj_bias"] = ("BF16", both.shape, bf16_bits(both).tobytes())
            continue
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)]) if len(t.shape) > 1 else w.reshape(-1)
        if model_type == "gemma4_text" and t.name == "rope_freqs.weight":
            # Not in the folder: the loader makes the factors from the config's RoPE.
            twin.add_tensor(t.name, w)
            rope_partial = 2 * int((w == 1.0).sum()) / head_dim
            continue
        if t.name == "output.weight":
            tied = False
        hf = w
        if arch == "llama" and t.name.split(".")[-2] in ("attn_q", "attn_k"):
            heads = n_head if t.name.split(".")[-2] == "attn_q" else n_kv
            rows = w.shape[0]
            hf = w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
        if qwen35:
            hf, w = qwen35_part(t.name, w, key, tiled=model_type != "qwen3_next")
        # Gemma's norms scale by 1 + w, and so do Qwen 3.5's (but its gated delta net's): the
        # folder holds w, GGUF 1 + w. The twin holds the number a reader of the folder computes:
        # the bf16 w plus one, in f32.
        norm_plus_one = (gemma or qwen35) and t.name.endswith("norm.weight") and "ssm_norm" not in t.name
        if norm_plus_one:
            hf = (w - np.float32(1)).astype(np.float32)
            if dtype == "BF16":
                back = (bf16_bits(hf).astype(np.uint32) << 16).view(np.float32)
                w = (back + np.float32(1)).astype(np.float32)
        # Read as f32 however the folder stores them: the convolution (f32 in GGUF) and A_log
        # (f32 in Qwen 3.5's folders too, its twin already the reader's number).
        as_f32 = qwen35 and t.name.endswith(("ssm_conv1d.weight", "ssm_a"))
        # Held in f32 by the folder whatever its type, as checkpoints hold them.
        kept_f32 = t.name.endswith(("ssm_a", "exp_probs_b.bias"))
        st_dtype = "F32" if dtype != "BF16" or kept_f32 else "BF16"
        if dtype == "BF16":
            # The twin holds the same values: bf16 matrices, f32 vectors.
            gg = bf16_bits(w)
            if norm_plus_one or kept_f32:
                twin_w = w
            elif as_f32 or w.ndim == 1:
                twin_w = (gg.astype(np.uint32) << 16).view(np.float32).reshape(w.shape)
            else:
                twin_w = None
        else:
            twin_w = w.astype(np.float32)
        kind = t.name.rsplit(".", 2)[-2] if t.name.startswith("blk.") else ""
        layer = t.name.split(".")[1] if t.name.startswith("blk.") else None

        def paired():
            """The twin holds this GGUF tensor as it is; the folder fuses it with its layer's
            partner: both, once both are read."""
            if twin_w is not None:
                twin.add_tensor(t.name, twin_w)
            else:
                twin.add_tensor(t.name, gg.reshape(w.shape), raw_shape=list(w.shape), raw_dtype=Q.BF16)
            experts.setdefault(layer, {})[kind] = w
            return experts[layer] if len(experts[layer]) == 2 else None

        if model_type in MLA and kind in ("attn_k_b", "attn_v_b"):
            # Transformers holds one kv_b_proj a layer: per head the key up-projection's rows
            # ([nope, kv_lora], GGUF's attn_k_b transposed) then the value one's.
            if (both := paired()) is None:
                continue
            k_b, v_b = both["attn_k_b"], both["attn_v_b"]
            kv_b = np.concatenate([k_b.swapaxes(1, 2), v_b], axis=1).reshape(-1, k_b.shape[1])
            parts = [(f"model.layers.{layer}.self_attn.kv_b_proj.weight", kv_b)]
        elif model_type == "qwen3_next" and kind in ("attn_qkv", "attn_gate"):
            # Qwen3-Next's folders hold, per key head, its query, key, values and gates in one
            # projection; GGUF all queries, keys and values in attn_qkv, the gates in attn_gate.
            if (both := paired()) is None:
                continue
            qkv, z = both["attn_qkv"], both["attn_gate"]
            nk, hk = key("ssm.group_count"), key("ssm.state_size")
            per_v = z.shape[0] // nk
            q, k, v = qkv[:nk * hk], qkv[nk * hk:2 * nk * hk], qkv[2 * nk * hk:]
            fused = np.concatenate([np.concatenate([q[g * hk:(g + 1) * hk], k[g * hk:(g + 1) * hk],
                                                    v[g * per_v:(g + 1) * per_v], z[g * per_v:(g + 1) * per_v]])
                                    for g in range(nk)])
            parts = [(f"model.layers.{layer}.linear_attn.in_proj_qkvz.weight", fused)]
        elif model_type in ("qwen3_5", "qwen3_5_moe") and kind in ("ffn_gate_exps", "ffn_up_exps"):
            # Transformers' Qwen 3.5 MoE holds each layer's experts' gate and up rows as one
            # [experts, 2 * rows, n_embd] tensor; the twin as ggml's merged ffn_gate_up_exps.
            experts.setdefault(layer, {})[kind] = w
            if len(experts[layer]) < 2:
                continue
            w = np.concatenate([experts[layer]["ffn_gate_exps"], experts[layer]["ffn_up_exps"]], axis=1)
            if dtype == "BF16":
                twin.add_tensor(f"blk.{layer}.ffn_gate_up_exps.weight", bf16_bits(w), raw_shape=list(w.shape),
                                raw_dtype=Q.BF16)
            else:
                twin.add_tensor(f"blk.{layer}.ffn_gate_up_exps.weight", w)
            parts = [(f"model.layers.{layer}.mlp.experts.gate_up_proj", w)]
        else:
            if twin_w is not None:
                twin.add_tensor(t.name, twin_w)
            else:
                twin.add_tensor(t.name, gg.reshape(w.shape), raw_shape=list(w.shape), raw_dtype=Q.BF16)
            if model_type in ("qwen3_5", "qwen3_5_moe") and kind == "ffn_down_exps":
                parts = [(f"model.layers.{t.name.split('.')[1]}.mlp.experts.down_proj", hf)]
            elif model_type == "gemma4_text":
                # Gemma 4's experts as Transformers stacks them (gate and up rows in one tensor).
                parts = [(hf_name(t.name, gemma=True, extra=GEMMA4_LAYER), hf)]
            elif kind.endswith("_exps"):
                parts = hf_names(t.name, hf)
            elif qwen35:
                parts = [(hf_name(t.name, extra=QWEN35_LAYER), hf)]
            elif model_type in MLA:
                parts = [(hf_name(t.name, extra=MLA_LAYER), hf)]
            elif model_type == "gpt_oss":
                parts = [(hf_name(t.name, extra=OSS_LAYER), hf)]
            else:
                parts = hf_names(t.name, hf, gemma)
        for hf_n, part in parts:
            if model_type == "qwen3_5":
                hf_n = hf_n.replace("model.", "model.language_model.", 1)
            raw = bf16_bits(part) if st_dtype == "BF16" else part.astype(np.float32)
            shards[i % 2][hf_n] = (st_dtype, part.shape, raw.tobytes())
    if model_type == "glm4_moe_lite":
        # An MTP layer past the model's own, as GLM-4.7-Flash's checkpoint has one.
        n = key("block_count")
        shards[1][f"model.layers.{n}.eh_proj.weight"] = ("BF16", (4, 8), bf16_bits(np.ones((4, 8))).tobytes())
        shards[1][f"model.layers.{n}.shared_head.norm.weight"] = ("BF16", (4,), bf16_bits(np.ones(4)).tobytes())
    if model_type == "qwen3_5":
        # What a reader of the language model leaves: a vision tower's and the MTP head's weights.
        shards[0]["model.visual.blocks.0.attn.qkv.weight"] = ("BF16", (3, 4), bf16_bits(np.ones((3, 4))).tobytes())
        shards[1]["mtp.fc.weight"] = ("BF16", (4, 8), bf16_bits(np.ones((4, 8))).tobytes())
    twin.write_header_to_file()
    twin.write_kv_data_to_file()
    twin.write_tensors_to_file()
    twin.close()

    weight_map = {}
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-00002.safetensors"
        write_safetensors(os.path.join(folder, fname), shard)
        weight_map.update({n: fname for n in shard})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    config = {
        "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                           "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                           "gemma3_text": "Gemma3ForCausalLM", "qwen3_5": "Qwen3_5ForConditionalGeneration",
                           "qwen3_5_moe": "Qwen3_5MoeForCausalLM",
                           "qwen3_next": "Qwen3NextForCausalLM", "glm4_moe_lite": "Glm4MoeLiteForCausalLM",
                           "deepseek_v3": "DeepseekV3ForCausalLM", "gpt_oss": "GptOssForCausalLM",
                           "gemma4_text": "Gemma4ForCausalLM"}[model_type]],
        "model_type": model_type, "hidden_size": n_embd, "num_hidden_layers": key("block_count"),
        "intermediate_size": key("feed_forward_length"), "num_attention_heads": n_head,
        "num_key_value_heads": n_kv, "head_dim": head_dim,
        "max_position_embeddings": key("context_length"), "vocab_size": len(tokens),
        "rope_theta": key("rope.freq_base") or 10000.0,
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"), "tie_word_embeddings": tied,
        "hidden_act": "silu", "attention_bias": model_type == "qwen2",
        "torch_dtype": "bfloat16" if dtype == "BF16" else "float32",
        "bos_token_id": field(r, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(r, "tokenizer.ggml.eos_token_id"),
    }
    if model_type == "qwen3_moe":
        config.update({"num_experts": key("expert_count"), "num_experts_per_tok": key("expert_used_count"),
                       "moe_intermediate_size": key("expert_feed_forward_length"), "norm_topk_prob": True,
                       "decoder_sparse_step": 1, "mlp_only_layers": []})
    if gemma:
        n_layer = key("block_count")
        config.update({"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": head_dim,
                       "sliding_window": key("attention.sliding_window"), "rope_local_base_freq": 10000.0,
                       "rope_scaling": None, "final_logit_softcapping": None, "attn_logit_softcapping": None,
                       "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                       for i in range(n_layer)]})
        del config["hidden_act"], config["attention_bias"]
    if qwen35:
        n_layer, every = key("block_count"), key("full_attention_interval")
        nv = key("ssm.time_step_rank")
        config.update({
            "linear_conv_kernel_dim": key("ssm.conv_kernel"), "linear_key_head_dim": key("ssm.state_size"),
            "linear_num_key_heads": key("ssm.group_count"), "linear_num_value_heads": nv,
            "linear_value_head_dim": key("ssm.inner_size") // nv, "full_attention_interval": every,
            "layer_types": ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n_layer)],
        })
        if model_type == "qwen3_next":
            # Transformers 4's Qwen3-Next config: RoPE fields at the top level.
            config.update({"partial_rotary_factor": key("rope.dimension_count") / head_dim, "rope_scaling": None,
                           "num_experts": key("expert_count"), "num_experts_per_tok": key("expert_used_count"),
                           "moe_intermediate_size": key("expert_feed_forward_length"),
                           "shared_expert_intermediate_size": key("expert_shared_feed_forward_length"),
                           "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []})
        else:
            config["rope_parameters"] = {"rope_type": "default", "rope_theta": config.pop("rope_theta"),
                                         "partial_rotary_factor": key("rope.dimension_count") / head_dim,
                                         "mrope_section": key("rope.dimension_sections")[:3],
                                         "mrope_interleaved": True}
        if model_type == "qwen3_5_moe":
            config.update({"num_experts": key("expert_count"), "num_experts_per_tok": key("expert_used_count"),
                           "moe_intermediate_size": key("expert_feed_forward_length"),
                           "shared_expert_intermediate_size": key("expert_shared_feed_forward_length")})
            # As Transformers writes Qwen 3.5 MoE's: no dense FFN size, experts' weights normalized.
            del config["intermediate_size"]
        elif model_type == "qwen3_5":
            # A vision-language checkpoint's config: the language model's under text_config.
            top = {k: config.pop(k) for k in ("architectures", "model_type", "tie_word_embeddings")}
            config = {**top, "text_config": {**config, "model_type": "qwen3_5_text"},
                      "vision_config": {"model_type": "qwen3_5_vision", "depth": 1}}
    if model_type in MLA:
        rope, nope = key("rope.dimension_count"), key("attention.key_length_mla") - key("rope.dimension_count")
        config.update({
            "num_key_value_heads": n_head, "kv_lora_rank": key("attention.kv_lora_rank"),
            "q_lora_rank": key("attention.q_lora_rank") or None, "qk_rope_head_dim": rope,
            "qk_nope_head_dim": nope, "v_head_dim": key("attention.value_length_mla"),
            "n_routed_experts": key("expert_count"), "num_experts_per_tok": key("expert_used_count"),
            "moe_intermediate_size": key("expert_feed_forward_length"),
            "n_shared_experts": key("expert_shared_count"), "routed_scaling_factor": key("expert_weights_scale"),
            "norm_topk_prob": bool(key("expert_weights_norm")), "scoring_func": "sigmoid", "topk_method": "noaux_tc",
            "n_group": key("expert_group_count") or 1, "topk_group": key("expert_group_used_count") or 1,
            "first_k_dense_replace": key("leading_dense_block_count"), "moe_layer_freq": 1,
            "num_nextn_predict_layers": 1 if model_type == "glm4_moe_lite" else 0,
            "partial_rotary_factor": 1.0,
        })
        del config["head_dim"]
        if key("rope.scaling.type") == "yarn":
            config["rope_scaling"] = {"type": "yarn", "factor": key("rope.scaling.factor"),
                                      "original_max_position_embeddings": key("rope.scaling.original_context_length"),
                                      "mscale": 1.0, "mscale_all_dim": key("rope.scaling.yarn_log_multiplier") / 0.1,
                                      "beta_fast": 32, "beta_slow": 1}
    if model_type == "gemma4_text":
        ffs = key("feed_forward_length")
        pattern = key("attention.sliding_window_pattern")
        config.update({
            "head_dim": key("attention.key_length_swa"), "global_head_dim": head_dim,
            "intermediate_size": ffs[0], "use_double_wide_mlp": ffs[-1] == 2 * ffs[0],
            "num_kv_shared_layers": key("attention.shared_kv_layers"),
            "hidden_size_per_layer_input": key("embedding_length_per_layer_input"),
            "vocab_size_per_layer_input": len(tokens), "sliding_window": key("attention.sliding_window"),
            "layer_types": ["sliding_attention" if x else "full_attention" for x in pattern],
            "rope_parameters": {
                "full_attention": {"rope_type": "proportional", "rope_theta": key("rope.freq_base"),
                                   "partial_rotary_factor": rope_partial},
                "sliding_attention": {"rope_type": "default", "rope_theta": key("rope.freq_base_swa"),
                                      "partial_rotary_factor": 1.0}},
            # The fixture's global layers have no V projection: V is K's.
            "attention_k_eq_v": True, "num_global_key_value_heads": n_kv,
            "final_logit_softcapping": key("final_logit_softcapping"), "enable_moe_block": bool(key("expert_count")),
            "hidden_activation": "gelu_pytorch_tanh",
        })
        if key("expert_count"):
            config.update({"num_experts": key("expert_count"), "top_k_experts": key("expert_used_count"),
                           "moe_intermediate_size": key("expert_feed_forward_length")})
        del config["rope_theta"], config["hidden_act"], config["attention_bias"]
    if model_type == "gpt_oss":
        n_layer = key("block_count")
        config.update({
            "num_local_experts": key("expert_count"), "num_experts_per_tok": key("expert_used_count"),
            "experts_per_token": key("expert_used_count"), "intermediate_size": key("expert_feed_forward_length"),
            "sliding_window": key("attention.sliding_window"), "swiglu_limit": 7.0, "attention_bias": True,
            "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layer)],
            "rope_scaling": {"rope_type": "yarn", "factor": key("rope.scaling.factor"), "beta_fast": 32.0,
                             "beta_slow": 1.0, "truncate": False,
                             "original_max_position_embeddings": key("rope.scaling.original_context_length")},
            "quantization_config": {"quant_method": "mxfp4",
                                    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                               "model.embed_tokens", "lm_head"]},
        })
        del config["hidden_act"]
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        if style == "spm":
            tj = spm_tokenizer_json(tokens, kinds, field(r, "tokenizer.ggml.scores"),
                                    tokens[field(r, "tokenizer.ggml.unknown_token_id")])
        else:
            tj = tokenizer_json(tokens, kinds, merges, style)
        json.dump(tj, f, ensure_ascii=False)
    tc = {"add_bos_token": style == "spm", "bos_token": tokens[field(r, "tokenizer.ggml.bos_token_id")],
          "eos_token": tokens[field(r, "tokenizer.ggml.eos_token_id")],
          "model_max_length": key("context_length"), "tokenizer_class": "GemmaTokenizer" if style == "spm" else "GPT2Tokenizer"}
    if style == "spm":
        tc["pad_token"] = tokens[field(r, "tokenizer.ggml.padding_token_id")]
        tc["unk_token"] = tokens[field(r, "tokenizer.ggml.unknown_token_id")]
    template = field(r, "tokenizer.chat_template")
    if template:
        tc["chat_template"] = template
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=1, ensure_ascii=False)
    print(f"wrote {folder} and its twin")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default=os.path.join(os.path.dirname(__file__), "..", "fixtures"))
    ap.add_argument("--models", default=os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                                                     "axle", "models"),
                    help="where the real models are (the `models:` sources)")
    ap.add_argument("--count", action="store_true", help="print how many folders this writes")
    a = ap.parse_args()
    if a.count:
        print(len(FOLDERS))
        return
    out = os.path.join(a.fixtures, "hf")
    os.makedirs(out, exist_ok=True)
    for src, name, model_type, dtype, style in FOLDERS:
        path = (os.path.join(a.models, src.split(":", 1)[1]) if src.startswith("models:")
                else os.path.join(a.fixtures, src))
        write_folder(path, out, name, model_type, dtype, style)


if __name__ == "__main__":
    main()
