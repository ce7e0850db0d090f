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
    # The real Gemma 3 270M (from the models cache, not the fixtures), with its SentencePiece
    # vocabulary as a byte-fallback BPE tokenizer.json, as Gemma's folders hold it.
    ("models:gemma-3-270m-q4_k_m.gguf", "gemma3-bf16", "gemma3_text", "BF16", "spm"),
]

QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
GGUF_PRE = {"smollm": "smollm", "qwen2": "qwen2", "llama3": "llama-bpe", "spm": "default"}

TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
       "output.weight": "lm_head.weight"}
LAYER = {"attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
         "attn_q.bias": "self_attn.q_proj.bias", "attn_k.weight": "self_attn.k_proj.weight",
         "attn_k.bias": "self_attn.k_proj.bias", "attn_v.weight": "self_attn.v_proj.weight",
         "attn_v.bias": "self_attn.v_proj.bias", "attn_output.weight": "self_attn.o_proj.weight",
         "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
         "ffn_norm.weight": "post_attention_layernorm.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
         "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
         "ffn_gate_inp.weight": "mlp.gate.weight"}


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


def hf_name(name, gemma=False):
    if name in TOP:
        return TOP[name]
    _, layer, rest = name.split(".", 2)
    return f"model.layers.{layer}.{(GEMMA_LAYER.get(rest) if gemma else None) or LAYER[rest]}"


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
    for i, t in enumerate(r.tensors):
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)]) if len(t.shape) > 1 else w.reshape(-1)
        if t.name == "output.weight":
            tied = False
        hf = w
        if arch == "llama" and t.name.split(".")[-2] in ("attn_q", "attn_k"):
            heads = n_head if t.name.split(".")[-2] == "attn_q" else n_kv
            rows = w.shape[0]
            hf = w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
        norm_plus_one = gemma and t.name.endswith("norm.weight")
        if norm_plus_one:
            # Gemma's norms scale by 1 + w: the folder holds w, GGUF 1 + w. The twin holds the
            # number a reader of the folder computes: the bf16 w plus one, in f32.
            hf = (w - np.float32(1)).astype(np.float32)
            if dtype == "BF16":
                back = (bf16_bits(hf).astype(np.uint32) << 16).view(np.float32)
                w = (back + np.float32(1)).astype(np.float32)
        if dtype == "BF16":
            st_dtype = "BF16"
            # The twin holds the same values: bf16 matrices, f32 vectors.
            gg = bf16_bits(w)
            if norm_plus_one:
                twin.add_tensor(t.name, w)
            elif w.ndim > 1:
                twin.add_tensor(t.name, gg.reshape(w.shape), raw_shape=list(w.shape), raw_dtype=Q.BF16)
            else:
                twin.add_tensor(t.name, (gg.astype(np.uint32) << 16).view(np.float32))
        else:
            st_dtype = "F32"
            twin.add_tensor(t.name, w.astype(np.float32))
        for hf_n, part in hf_names(t.name, hf, gemma):
            raw = bf16_bits(part) if dtype == "BF16" else part.astype(np.float32)
            shards[i % 2][hf_n] = (st_dtype, part.shape, raw.tobytes())
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
                           "gemma3_text": "Gemma3ForCausalLM"}[model_type]],
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
