"""SmoothQuant (Xiao et al., 2022) for W8A8: move activation outliers into the
weights with a per-input-channel factor s_j = max|x_j|^a / max|W_:,j|^(1-a).
The Linear sees x / s and W * s (the same product); x / s is folded, for free,
into the op that produces x:

* RMSNorm(x, w)            -> w / s           (q/k/v after attn_norm, gate/up after ffn_norm)
* Mul(act(gate), up)       -> up rows / s     (ffn_down)
* Attention(q, k, v)       -> v rows / s      (attn_output; s shared by the query heads of a KV head)

Linears whose input comes from anything else, or whose weights serve another op
too (a tied embedding), are left alone.
"""

from __future__ import annotations

import numpy as np

from rkc.ir.graph import Graph

# `rkc compile --precision int8` default (also for groups an alpha dict does not list)
DEFAULT_ALPHA = 0.5


def _factors(act: np.ndarray, mats: list[np.ndarray], alpha: float) -> np.ndarray:
    wmax = np.max([np.abs(m).max(axis=0) for m in mats], axis=0)
    s = np.power(np.maximum(act, 1e-5), alpha) / np.power(np.maximum(wmax, 1e-5), 1 - alpha)
    s = np.where(act > 0, s, 1.0)
    return np.clip(s, 1e-4, 1e4).astype(np.float32)


def smooth(graph: Graph, weights: dict[str, np.ndarray], ranges: dict[str, np.ndarray],
           alpha: float | dict[str, float] = DEFAULT_ALPHA) -> dict[str, np.ndarray]:
    """Rescale `weights` (fp32, in place; groups whose Linears it does not
    hold are left alone); return, per Linear weight smoothed,
    the factors s its input columns were multiplied by (its input is now x / s).
    `alpha` may be given per group of Linears that read one input (keyed by
    that input tensor; groups not listed get DEFAULT_ALPHA)."""
    producers = graph.producers()
    consumers = graph.consumers()
    groups: dict[str, list[str]] = {}
    for op in graph.ops:
        if op.type == "Linear":
            groups.setdefault(op.inputs[0], []).append(op.inputs[1])
    done: dict[str, np.ndarray] = {}
    for x, names in groups.items():
        if any(n not in weights for n in names):
            continue  # another layer's (a compile smooths layer by layer)
        a_of = alpha.get(x, DEFAULT_ALPHA) if isinstance(alpha, dict) else alpha
        if a_of <= 0:
            continue
        if any(len(consumers[n]) != 1 for n in names) or any(n not in ranges for n in names):
            continue
        prod = producers.get(x)
        act = np.max([ranges[n] for n in names], axis=0)
        mats = [weights[n] for n in names]
        if prod is None:
            continue
        if prod.type == "RMSNorm" and len(consumers[prod.inputs[1]]) == 1:
            s = _factors(act, mats, a_of)
            weights[prod.inputs[1]] = weights[prod.inputs[1]] / s
        elif prod.type == "Mul" and producers.get(prod.inputs[1]) is not None \
                and producers[prod.inputs[1]].type == "Linear":
            up = producers[prod.inputs[1]]
            s = _factors(act, mats, a_of)
            _divide_rows(weights, up.inputs, s)
        elif prod.type == "Attention" and _v_projection(producers, prod) is not None:
            # attention output channel (h, d) carries v channel (h // group, d)
            v_lin = _v_projection(producers, prod)
            hkv = int(prod.attrs["kv_heads"])
            n_v = weights[v_lin.inputs[1]].shape[0]
            group = act.size // n_v
            a = act.reshape(hkv, group, -1).max(axis=1).reshape(-1)
            per_kv = [np.abs(m).reshape(m.shape[0], hkv, group, -1).max(axis=2).reshape(m.shape[0], -1) for m in mats]
            s_kv = _factors(a, per_kv, a_of)
            _divide_rows(weights, v_lin.inputs, s_kv)
            s = np.repeat(s_kv.reshape(hkv, 1, -1), group, axis=1).reshape(-1)
        else:
            continue
        for n in names:
            weights[n] = weights[n] * s[None, :]
            done[n] = s
    return done


def _v_projection(producers: dict, attention):
    """The Linear whose reshaped rows are the attention's V, if V is exactly
    that (not RMS-normed as Gemma 4's, which a row scale would not pass through)."""
    reshape = producers.get(attention.inputs[2])
    if reshape is None or reshape.type != "Reshape":
        return None
    lin = producers.get(reshape.inputs[0])
    return lin if lin is not None and lin.type == "Linear" else None


def _divide_rows(weights: dict[str, np.ndarray], linear_inputs: list[str], s: np.ndarray) -> None:
    w, bias = linear_inputs[1], (linear_inputs[2] if len(linear_inputs) > 2 else None)
    weights[w] = weights[w] / s[:, None]
    if bias:
        weights[bias] = weights[bias] / s
