"""Corrupted but parseable variants of a GGUF file, one change each, for the hostile-input corpus
(tests/python/test_gguf_corpus.py): every numeric metadata value of the architecture set to values
no model has (NaN, infinities, negatives, zero, the type's maximum), arrays cut to one element or zeroed,
each tensor of the first layer and of the head stored as another type (F32, F16, Q8_0) or
removed. Variants come as (name, kind, writer): kind is `float`, `int`, `array`, `key-removed`,
`tensor-type` or `tensor-removed`, and `writer(path)` writes the file.

    python scripts/gguf_corpus.py FIXTURE [--list]     # what a fixture's corpus holds
"""
import sys

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
V = gguf.GGUFValueType

FLOATS = {V.FLOAT32, V.FLOAT64}
INTS = {V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64}
MAX = {V.UINT8: 255, V.UINT16: 65535, V.UINT32: 2**32 - 1, V.UINT64: 2**64 - 1,
       V.INT8: 127, V.INT16: 32767, V.INT32: 2**31 - 1, V.INT64: 2**63 - 1}
SIGNED = {V.INT8, V.INT16, V.INT32, V.INT64}


def _copy(reader, path, *, kv=None, drop_key=None, tensor=None, new_type=None, drop_tensor=None):
    """Writes `reader`'s file to `path` with one change: metadata `kv` = (key, value), key
    `drop_key` removed, tensor `tensor` converted to `new_type`, or tensor `drop_tensor` removed."""
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(path, arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF.") or field.name == drop_key:
            continue
        vt = field.types[0]
        sub = field.types[-1] if vt == V.ARRAY else None
        value = field.contents()
        if kv is not None and field.name == kv[0]:
            value = kv[1]
        w.add_key_value(field.name, value, vt, sub_type=sub)
    for t in reader.tensors:
        if t.name == drop_tensor:
            continue
        if t.name == tensor:
            values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            if new_type == Q.F32:
                w.add_tensor(t.name, values, raw_dtype=Q.F32)
            elif new_type == Q.F16:
                w.add_tensor(t.name, values.astype(np.float16), raw_dtype=Q.F16)
            else:
                w.add_tensor(t.name, gguf.quants.quantize(values, new_type), raw_dtype=new_type)
        else:
            w.add_tensor(t.name, t.data, raw_shape=None, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def variants(path):
    """(name, kind, writer) for every variant of the file at `path`."""
    reader = gguf.GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()
    out = []
    for field in reader.fields.values():
        name, vt = field.name, field.types[0]
        if not name.startswith(arch + "."):
            continue
        if vt in FLOATS:
            for v in (float("nan"), float("inf"), -1.0, 0.0):
                out.append((f"{name}={v}", "float", dict(kv=(name, v))))
        elif vt in INTS:
            values = [0, MAX[vt]] + ([-1] if vt in SIGNED else [])
            for v in values:
                out.append((f"{name}={v}", "int", dict(kv=(name, v))))
        elif vt == V.ARRAY and field.types[-1] in INTS | FLOATS:
            n = len(field.contents())
            # gguf-py writes no empty arrays: a one-element array is the shortest variant.
            out.append((f"{name}=[0]", "array", dict(kv=(name, [0]))))
            out.append((f"{name}=zeros", "array", dict(kv=(name, [0] * n))))
        if vt != V.ARRAY or field.types[-1] in INTS | FLOATS:
            out.append((f"{name} removed", "key-removed", dict(drop_key=name)))
    for t in reader.tensors:
        if t.name.startswith("blk.") and not t.name.startswith("blk.0."):
            continue
        ne0 = int(t.shape[0])
        for ty in (Q.F32, Q.F16, Q.Q8_0):
            if ty == t.tensor_type or (ty == Q.Q8_0 and ne0 % 32 != 0):
                continue
            out.append((f"{t.name} as {ty.name}", "tensor-type", dict(tensor=t.name, new_type=ty)))
        out.append((f"{t.name} removed", "tensor-removed", dict(drop_tensor=t.name)))
    return [(name, kind, (lambda p, kw=kw: _copy(reader, p, **kw))) for name, kind, kw in out]


if __name__ == "__main__":
    for name, kind, _ in variants(sys.argv[1]):
        print(f"{kind}\t{name}")
