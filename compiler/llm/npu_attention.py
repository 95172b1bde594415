"""Attention's two products for a prefill chunk as fp16 NPU GEMMs, one pair
per KV head (its G query heads share K and V: GQA), with the softmax between
them on the CPU (runtime/llm/npu_attention.py). int8 models too: attention's
operands are activations, so the products are fp16 whatever the weights are.

For a chunk of C query rows and a KV head with G query heads, M = C * G
query rows in (token, head) order, D = head_dim, Dv = the values' head dim,
and P key slots (a cache bucket, or a sliding window's ring):

* scores   S[M, P]    = Q[M, D] x K^T[D, P]: A is Q as a GEMM feature (written
  by the host like any segment input); B is the KV head's keys as the GEMM's
  weights, each key one kernel of D channels. In that layout a key's D
  values sit at a place that depends only on its slot and D, not on P, so
  the cache keeps its keys there (one kernel written per new key, nothing
  moved per chunk) and a product over the first P slots reads a prefix of it.
  S is written fp32, the softmax's input.
* values   O^T[Dv, M] = V^T[Dv, P] x Pr^T[P, M]: A is the values transposed, a
  GEMM feature of Dv rows and P channels (NC1HWC2: a key's channel group is
  Dv * 16 bytes apart whatever P is, so again the cache's place and a prefix
  for fewer slots); B is the softmax's probabilities Pr, each query row one
  kernel of P channels, which the softmax writes straight in that layout
  from S. O^T is fp32; the host reads it into the attention's output.

The layouts the host writes and reads (the cache's keys and values, the
probabilities, the output) are runtime/llm/npu_attention.py's.

Keys past the cache's fill (zeros) and keys the causal mask or a window
hides get probability 0, so the products may run over more slots than a
chunk sees: prefill programs fix P per program (a bucket of positions), and
a windowed layer's ring is always whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rkc.compiler.npu import api
from rkc.compiler.npu.dispatch import emit
from rkc.ir.errors import UnsupportedError
from rkc.ir.npu import layout
from rkc.ir.npu.perf import JobCost, PerfModel
from rkc.runtime.llm.npu_attention import KEY_ALIGN

FP16 = "fp16"


@dataclass(frozen=True)
class AttentionShape:
    """One KV head's products for one chunk."""

    rows: int  # C: the chunk's query rows
    group: int  # G: query heads per KV head
    head_dim: int  # D
    value_dim: int  # Dv
    keys: int  # P: key slots the products run over (a multiple of KEY_ALIGN)

    def __post_init__(self) -> None:
        if self.keys % KEY_ALIGN or self.keys < KEY_ALIGN:
            raise UnsupportedError(f"attention over {self.keys} key slots: the NPU products take whole "
                                   f"groups of {KEY_ALIGN}")
        if self.head_dim % layout.c2_for(2) or self.value_dim % layout.c2_for(2):
            raise UnsupportedError(f"attention head dims {self.head_dim}/{self.value_dim}: the NPU products "
                                   f"take multiples of {layout.c2_for(2)}")

    @property
    def query_rows(self) -> int:
        """M: the scores' rows, the probabilities' kernels."""
        return self.rows * self.group


@dataclass(frozen=True)
class HeadBuffers:
    """The buffers of one KV head's products (names resolved by relocation)."""

    queries: str  # Q [M, D] fp16 feature (host-written)
    keys: str  # the K cache: [slots] kernels of D channels, fp16 weights layout
    values: str  # the V cache: V^T [Dv, slots] fp16 feature
    scores: str  # S [M, P] fp32 feature (NPU-written, softmax-read)
    probs: str  # Pr [M kernels of P channels] fp16 weights layout (softmax-written)
    out: str  # O^T [Dv, M] fp32 feature (NPU-written)

    @classmethod
    def named(cls, prefix: str, cache: str) -> "HeadBuffers":
        """`prefix`: the chunk's per-head scratch; `cache`: the layer's head's cache."""
        return cls(f"{prefix}.q", f"{cache}.k", f"{cache}.v", f"{prefix}.s", f"{prefix}.p", f"{prefix}.o")


def products(shape: AttentionShape, buf: HeadBuffers, name: str) -> tuple[api.Gemm, api.Gemm]:
    """The scores' and the values' GEMMs of one KV head (`name` names their tasks)."""
    m, d, dv, p = shape.query_rows, shape.head_dim, shape.value_dim, shape.keys
    scores = api.Gemm(api.Feature.gemm(buf.queries, 0, m, d, FP16), _standin(d, p),
                      api.Feature.gemm(buf.scores, 0, m, p, "fp32"), m, name=f"{name}.qk", b_buffer=buf.keys)
    values = api.Gemm(api.Feature.gemm(buf.values, 0, dv, p, FP16), _standin(p, m),
                      api.Feature.gemm(buf.out, 0, dv, m, "fp32"), dv, name=f"{name}.pv", b_buffer=buf.probs)
    return scores, values


def _standin(k: int, n: int) -> np.ndarray:
    """B's shape and dtype for a run-time operand (api.Gemm.b_buffer)."""
    return np.broadcast_to(np.float16(0), (k, n))


def layer_jobs(shape: AttentionShape, kv_heads: int, options: api.EmitOptions | None = None
               ) -> tuple[list[JobCost], list[JobCost]]:
    """The planned jobs of one layer's two NPU phases (every KV head's scores,
    then every KV head's values), each phase one chained job per core."""
    options = options or api.EmitOptions()
    phases: tuple[list, list] = ([], [])
    for h in range(kv_heads):
        for results, gemm in zip(phases, products(shape, HeadBuffers.named(f"chunk.h{h}", f"cache.h{h}"),
                                                  f"attn.h{h}")):
            results.append(emit(gemm, options))
    out = []
    for results in phases:
        by_lane: dict[int, list] = {}
        for r in results:
            for job in r.jobs:
                by_lane.setdefault(job.lane, []).extend(r.tasks[t].cost() for t in job.tasks)
        out.append([JobCost(lane, 1, tasks) for lane, tasks in sorted(by_lane.items())])
    return out[0], out[1]


def modelled_seconds(shape: AttentionShape, kv_heads: int, model: PerfModel | None = None) -> float:
    """Modelled NPU time of one layer's attention products for one chunk (two
    submissions, hardware chaining, ir/npu/perf.py)."""
    model = model or PerfModel()
    return sum(model.submission_seconds(jobs) for jobs in layer_jobs(shape, kv_heads))


# The CPU's side of the choice: the products as the host would run them
# (runtime/llm/prefill_attention.attend_blocks, blocks of BLOCK query rows over
# the keys each block sees), at the board's peak fp32 rate: four Cortex-A76 at
# 2.4 GHz (RK3588 datasheet), each two 128-bit FMA pipes, 16 FLOP a cycle.
# A peak the host never reaches, so the NPU is chosen only where it beats the
# CPU's best case.
HOST_PEAK_FLOPS = 4 * 2.4e9 * 16
HOST_BLOCK = 64  # query rows per block (prefill_attention.BLOCK)


def host_product_macs(shape: AttentionShape, kv_heads: int, first_position: int = 0) -> int:
    """Multiply-adds of one layer's two products on the host for a chunk whose
    first query sits at `first_position` with every earlier key cached."""
    g, d, dv = shape.group, shape.head_dim, shape.value_dim
    macs = 0
    for t0 in range(0, shape.rows, HOST_BLOCK):
        t1 = min(shape.rows, t0 + HOST_BLOCK)
        seen = first_position + t1  # keys up to the block's last query
        macs += (t1 - t0) * g * kv_heads * seen * (d + dv)
    return macs


# The NPU path's host work that the host attention does not do (runtime/llm/npu_attention.py),
# per element, as bench/prefill_attention.py measured it on the 2-core x86 build machine
# (docs/notes/2026-12-06-npu-attention.md: one Qwen2.5-1.5B head at 512 rows, 3072 x 512
# scores): the scores' transposing read 0.45 ms and the probabilities' fp16 rounding and
# transposing store 1.7 ms (1.37 ns a score); the queries rounded into their GEMM feature
# and the output read back, ~1 ns a value. An A76 is no faster, so these bound its cost
# from below. The softmax itself is both paths' and is not counted.
HOST_NS_PER_SCORE = 1.37
HOST_NS_PER_QUERY_VALUE = 1.0


def npu_path_host_seconds(shape: AttentionShape, kv_heads: int) -> float:
    """Host seconds the NPU path adds for one layer's chunk (HOST_NS_PER_*)."""
    m = shape.query_rows
    scores = m * shape.keys
    values = m * (shape.head_dim + shape.value_dim)
    return kv_heads * (scores * HOST_NS_PER_SCORE + values * HOST_NS_PER_QUERY_VALUE) * 1e-9


def on_npu(shape: AttentionShape, kv_heads: int, model: PerfModel | None = None) -> bool:
    """Whether a chunk's attention costs less with its products on the NPU
    (modelled NPU time + the host work that path adds: npu_path_host_seconds)
    than with them on the host at its peak (HOST_PEAK_FLOPS), the chunk
    starting at position 0 (a later chunk sees more keys: the host's cost
    grows faster than the NPU's). bench/prefill_attention.py measures both."""
    npu = modelled_seconds(shape, kv_heads, model) + npu_path_host_seconds(shape, kv_heads)
    return npu < 2 * host_product_macs(shape, kv_heads) / HOST_PEAK_FLOPS
