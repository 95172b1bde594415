"""Where a compiled int8 model and the numpy w8a8 reference (reference.py) part,
row by row: decoded token by token, the reference fed the runtime's own fp16
KV entries (so no earlier row's difference reaches a row), each row's every
int8 product input must carry the same codes and its own K/V entries the same
fp16 values, until a value within fp32 ulps of a rounding edge (float64 in the
reference, fp32 in the runtime) rounds the other way: a tie. A row without one
must give the same logits, to fp32 noise."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from llm.reference import ReferenceModel, quantize_rows

# the int8 products in program order: the quantized input's name -> the reference's product
# (embd_scaled, ffn_residual and pl_gated are quantized only in gemma4's per-layer path)
PRODUCT_OF = {"embd_scaled": "per_layer_model_proj", "attn_norm": "attn_q", "attn": "attn_output",
              "ffn_norm": "ffn_gate", "ffn_hidden": "ffn_down", "ffn_residual": "inp_gate", "pl_gated": "proj"}

NOISE = 2e-6  # fp32 against float64, relative to a row's largest value (measured on gemma4: <= 7e-7)
# fp32's unit roundoff. The runtime's softmax takes exp(s - max s) in fp32: an
# argument of size |s| carries an absolute rounding error up to U32 |s|, which
# exp turns into a relative error of the weight, so an attention output's fp32
# noise grows with its largest score (measured on Llama-3.2-1B's real widths,
# random weights: scores up to 215, outputs 2.9e-6 off a float64 softmax; with
# the runtime's attention in float64 they agree to the reference's 2e-6)
U32 = 2.0 ** -24


@dataclass
class Parting:
    ties: list[str] = field(default_factory=list)  # "row t <where it parted>"
    departures: list[str] = field(default_factory=list)  # rows parting where no value is on an edge
    clean: list[float] = field(default_factory=list)  # the other rows' logits: max error / row's largest


def first_departure(step: dict, products: dict, entries: list, own: list, head: str,
                    scores: dict[int, float] | None = None) -> str | None:
    """A row's first departure from the reference, in program order: None, or
    what it is ("tie ..." when the value is within fp32 ulps of a rounding edge).
    `scores`: layer -> the row's largest |attention score| (the fp32 softmax's noise)."""
    scores = scores or {}
    product_of = PRODUCT_OF | {"result_norm": head}
    quantized = [n[len("decode/"):-len("@npu")] for n in step if n.endswith("@npu")]
    for name in [n for n in quantized if n.split(".")[-1] in product_of]:
        short = name.split(".")[-1]
        layer = name.split(".")[1] if name.startswith("blk.") else None
        if short == "attn" and layer is not None:  # this layer's K/V entries come before its attention
            for kind in ("k", "v"):
                got, want = entries[int(layer)][kind], own[int(layer)].get(kind)
                if got is None or np.array_equal(got, want.reshape(got.shape)):
                    continue
                x32, x = entries[int(layer)][kind + "32"], own[int(layer)][kind + "64"].reshape(got.shape)
                i = tuple(int(j) for j in np.argwhere(got != want.reshape(got.shape))[0])
                # both unrounded values agree to fp32 noise (relative to the row: RoPE and
                # the norms mix its elements), so the fp16 edge lies between them
                near = abs(np.float64(x32[i]) - x[i]) <= NOISE * np.abs(x).max()
                return (f"{'tie' if near else 'departure'}: layer {layer} {kind.upper()} entry {i[1:]} "
                        f"{x32[i]:.8f} (fp32) / {x[i]:.8f} -> {got[i]:.6f} / {want.reshape(got.shape)[i]:.6f}")
        rname = product_of[short] if layer is None else f"blk.{layer}.{product_of[short]}"
        x = products[rname]
        err = np.abs(step[f"decode/{name}"].reshape(x.shape) - x).max() / np.abs(x).max()
        bound = NOISE + (2 * U32 * scores.get(int(layer), 0.0) if short == "attn" and layer is not None else 0.0)
        if err > bound:
            return f"departure: {name} differs by {err:.1e} of its largest value (fp32 noise bound {bound:.1e})"
        q, s = quantize_rows(x)
        got = step[f"decode/{name}@npu"].astype(np.float64).reshape(q.shape)
        if np.array_equal(got, q):
            continue
        i = tuple(np.argwhere(got != q)[0])
        r = np.float64(np.float32(x[i]) / np.float32(s[i[0]]))
        near = abs(got[i] - q[i]) == 1 and abs(abs(r - np.floor(r)) - 0.5) < 4e-5
        return f"{'tie' if near else 'departure'}: {name} column {i[-1]} x/scale {r:.6f} -> {got[i]:.0f} / {q[i]:.0f}"
    return None


def parting(engine, ref: ReferenceModel, tokens: list[int], monkeypatch, cache_rows: int = 64) -> Parting:
    """Decode `tokens` one by one on `engine` (an int8 LlmEngine) and on `ref`
    (its w8a8 reference, reset), the reference's KV cache holding the runtime's
    entries; each row sorted into ties, departures or clean (with its logits' error)."""
    import rkc.runtime.llm.engine as engine_module
    import rkc.runtime.llm.kernels as kernels
    from rkc.runtime.llm.kvcache import KVCache

    L = engine.cfg.n_layer
    step, entries = {}, [dict(k=None, v=None, k32=None, v32=None) for _ in range(L)]
    write, store = engine_module._LlmRun.write, KVCache.store_and_view

    def capture(self, name, value):
        step[name] = np.array(value)
        return write(self, name, value)

    def stored(self, layer, k, v, pos):
        entries[layer].update(k=k.astype(np.float16).astype(np.float64), v=v.astype(np.float16).astype(np.float64),
                              k32=np.array(k), v32=np.array(v))
        return store(self, layer, k, v, pos)

    scores: dict[int, float] = {}
    attend = kernels.attend

    def observed(q, keys, values, kpos, pos, attrs, rows):  # the runtime's own attention, its largest score noted
        s = np.einsum("thd,phd->thp", q.astype(np.float64),
                      np.repeat(keys.astype(np.float64), q.shape[1] // keys.shape[1], axis=1))
        seen = kpos[None, :] <= pos[:, None]
        if int(attrs["window"]):
            seen &= (pos[:, None] - kpos[None, :]) < int(attrs["window"])
        layer = int(attrs["layer"])
        largest = np.where(seen[:, None, :], np.abs(s * attrs["scale"]), 0).max()
        scores[layer] = max(scores.get(layer, 0.0), float(largest))
        return attend(q, keys, values, kpos, pos, attrs, rows)

    monkeypatch.setattr(engine_module._LlmRun, "write", capture)
    monkeypatch.setattr(KVCache, "store_and_view", stored)
    monkeypatch.setattr(kernels, "attend", observed)
    products, own, unrounded = {}, [dict() for _ in range(L)], []
    lin, to_cache0 = ReferenceModel.lin, ReferenceModel.to_cache

    def recorded(self, x, name):
        products[name] = x.copy()
        return lin(self, x, name)

    def to_cache(a):
        unrounded.append(np.array(a))
        return to_cache0(a)

    class Fed(list):  # the reference's own entry is kept aside; the runtime's goes in the cache
        def __init__(self, layer, kind):
            super().__init__()
            self.layer, self.kind = layer, kind

        def append(self, a):  # after to_cache rounded k, then v
            own[self.layer][self.kind] = a.copy()
            own[self.layer][self.kind + "64"] = unrounded[-2 if self.kind == "k" else -1]
            super().append(entries[self.layer][self.kind].reshape(a.shape))

    monkeypatch.setattr(ReferenceModel, "to_cache", staticmethod(to_cache))
    monkeypatch.setattr(ReferenceModel, "lin", recorded)
    ref.reset()
    ref.k_cache, ref.v_cache = [Fed(i, "k") for i in range(L)], [Fed(i, "v") for i in range(L)]
    head = "output" if "output.weight" in ref.w else "token_embd"
    cache = engine.new_cache(max(cache_rows, len(tokens)))
    out = Parting()
    for t, token in enumerate(tokens):
        step.clear()
        scores.clear()
        for e, o in zip(entries, own):
            e.update(k=None, v=None)
            o.clear()
        got = engine.run_interpreted("decode", np.asarray([token], np.int32), np.asarray([t], np.int32), cache)
        products.clear()
        want = ref.forward([token], t)
        first = first_departure(step, products, entries, own, head, scores)
        err = np.abs(got[0] - want[0]).max() / np.abs(want[0]).max()
        if first is None:
            out.clean.append(err)
        else:
            (out.ties if first.startswith("tie") else out.departures).append(f"row {t} {first}")
    return out
