"""Rotated W8A8 (QuaRot-style, docs/llm.md): every int8 product x W^T runs as
(x R)(W R)^T with R an orthogonal (randomised Hadamard) rotation of its input
axis (runtime/kernels/hadamard.py). The compiler folds R into the weights here
(W R, in float, before rounding) and into GPTQ's X^T X (R^T X^T X R, the second
moment of the rotated input); the runtime's QuantizeRows rotates each
activation row as it quantizes it, and a tied embedding's rows gathered from
the rotated head are rotated back.

One rotation per input width K (seeded), shared by every product of that width;
the default ("auto") picks its construction per width (runtime/kernels/hadamard.py).
The rkbin records R itself (signs, block, factor), so a runtime applies whatever
construction a build chose.
"""

from __future__ import annotations

import numpy as np

from rkc.runtime.kernels.hadamard import KINDS, Rotation, make_rotation, rotate

NONE = "none"
CHOICES = (*KINDS, NONE)
DEFAULT_ROTATION = "auto"
SEED = 0
# float64 bytes rotated at a time: a block that stays in cache (a 262k-row head
# rotated in 16384-row blocks ran ~2.5x slower; rows rotate independently, so
# the bits do not depend on the block)
ROTATE_BYTES = 1 << 20


def rotation_for(k: int, kind: str, precision: str = "int8") -> Rotation | None:
    """The rotation of a `precision` build's products of input width k. An int4
    build's "auto" is kron at every width: its int4 weight groups lost more to
    the Hartley factor's less even spread than int8 did (Gemma 3 270M with
    C5 (x) H128 forced at 640: KL +3.6 %, top-1 -1.7 points;
    docs/notes/2026-12-06-rotation-odd-widths.md)."""
    if kind == NONE:
        return None
    return make_rotation(k, "kron" if kind == "auto" and precision == "int4" else kind, SEED)


def rotate_matrix(w: np.ndarray, rot: Rotation) -> np.ndarray:
    """W R: every row rotated like an activation row (exact in float)."""
    w = np.asarray(w, np.float32)
    out = np.empty_like(w)
    step = max(1, ROTATE_BYTES // (8 * w.shape[1]))
    for r0 in range(0, w.shape[0], step):
        out[r0:r0 + step] = rotate(w[r0:r0 + step].astype(np.float64), rot)
    return out


def rotate_hessian(h: np.ndarray, rot: Rotation) -> np.ndarray:
    """R^T H R for the (symmetric) second moment H of an input x: that of x R."""
    return rotate(rotate(np.asarray(h, np.float64), rot).T.copy(), rot)
