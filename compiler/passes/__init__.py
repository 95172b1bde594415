"""Graph rewrites. Each rewrite is a small function `(graph, op) -> bool` that
changes the graph around one op and says whether it did; `apply` walks the ops
until none applies. Order: canonical form first, then folds and fusions."""

from __future__ import annotations

from typing import Callable, Sequence

from rkc.compiler.ops import infer_for
from rkc.compiler.passes import affine, canonicalize, flat_head, fold_batchnorm, fuse, groups, heads, image_blocks
from rkc.compiler.passes.edit import remove_dead
from rkc.ir.graph import Graph, Op

Rewrite = Callable[[Graph, Op], bool]

PIPELINE: Sequence[Rewrite] = (*canonicalize.REWRITES, *flat_head.REWRITES, *fold_batchnorm.REWRITES,
                               *groups.REWRITES, *fuse.REWRITES)
# after the fusions have matched their patterns: the remaining per-channel affine
# maps become depthwise convolutions (the folds still run, on what they produce); a
# stride-2 convolution of a uint8 image then reads it as 2x2 blocks (image_blocks.py)
AFFINE: Sequence[Rewrite] = (*PIPELINE, *affine.REWRITES, *image_blocks.REWRITES)


def apply(graph: Graph, rewrites: Sequence[Rewrite], limit: int = 100_000) -> int:
    """Apply rewrites until a fixed point; returns how many fired."""
    fired = 0
    progress = True
    while progress:
        progress = False
        for op in list(graph.ops):
            if not any(o is op for o in graph.ops):
                continue  # removed by an earlier rewrite in this sweep
            for rewrite in rewrites:
                if rewrite(graph, op):
                    fired += 1
                    progress = True
                    break
        if fired > limit:
            raise RuntimeError("graph rewrites do not converge")
    remove_dead(graph)
    return fired


def run_passes(graph: Graph, int8: bool = False, npu_attention: bool = False) -> Graph:
    """`int8`: the graph becomes a calibrated int8 program (its tensors are
    calibrated after the passes), which adds the int8-only rewrites.
    `npu_attention`: batched attention products are split per head for the NPU
    (heads.py; compiler/build.py's _place undoes it where a head's product stays on the CPU)."""
    apply(graph, (*PIPELINE, *heads.REWRITES) if npu_attention else PIPELINE)
    apply(graph, (*affine.INT8_REWRITES, *AFFINE) if int8 else AFFINE)
    graph.verify(infer_for(graph))
    return graph
