"""An ONNX-style rkbin as a Python object: run(inputs) -> outputs."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from rkc.ir.rkbin import Rkbin
from rkc.runtime.execute import RunStats, check_feeds
from rkc.runtime.loader import LoadedModel, needs_device


class OnnxModel:
    def __init__(self, rk: Rkbin, device: str = "auto", cores: int = 3) -> None:
        from rkc.runtime.devices import open_device  # deferred: the simulator and the rocket driver, when needed

        self.rkbin = rk
        self.program = rk.module.programs[0]
        self._tensors = {t.name: t for t in rk.module.tensors}
        dev = open_device(device, cores=cores) if device != "auto" or needs_device(rk.module) else None
        self.model = LoadedModel(rk, dev, own_device=dev is not None)

    @property
    def inputs(self) -> list[str]:
        return list(self.program.inputs)

    @property
    def device(self):
        return self.model.device

    @property
    def last_run(self) -> RunStats | None:
        return self.model.last_run

    def check(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Raise InputError for a missing, unknown or misshapen input (before anything runs)."""
        check_feeds(self.program, self._tensors, inputs)

    def run(self, inputs: Mapping[str, np.ndarray], fp16_outputs: bool = False) -> dict[str, np.ndarray]:
        """The outputs by name, for inputs keyed by the model's input names.
        fp16_outputs=True: an output the NPU computed in fp16 comes back as that float16
        array instead of widened to float32 (the same values, half the bytes to write)."""
        self.check(inputs)
        return self.model.run(inputs, fp16_outputs=fp16_outputs)

    def close(self) -> None:
        self.model.close()

    def __enter__(self) -> "OnnxModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
