"""Constant regions of a loaded model: regions whose bytes are the rkbin's
blob as stored, because no relocation patches them and no NPU job writes them
(packed weights, for example). The CPU reads such tensors straight from the
(memory-mapped) blob: no CPU access bracket on the BO, which would also make
the device drop what it decoded from those bytes, and only the pages read are
touched."""

from __future__ import annotations

import numpy as np

from rkc.ir.program import Module, TensorInfo


def constant_regions(module: Module) -> frozenset[str]:
    written = {r for p in module.programs for s in p.steps for j in s.jobs for r in j.writes}
    relocated = {rel.region for rel in module.relocations}
    return frozenset(r.name for r in module.regions
                     if r.blob and r.kind != "host" and r.name not in written | relocated)


def constant_bytes(model, info: TensorInfo) -> np.ndarray | None:
    """The stored bytes of `info` (a tensor in a constant region of `model`, a
    LoadedModel), or None when its region is not constant."""
    regions = getattr(model, "_constant_regions", None)
    if regions is None:
        regions = model._constant_regions = constant_regions(model.module)
    if info.region not in regions:
        return None
    blob = model.rkbin.blobs[next(r.blob for r in model.module.regions if r.name == info.region)]
    return blob[info.offset:info.offset + info.nbytes]
