"""`rkrun MODEL --inputs in.npz --outputs out.npz`: run an ONNX-style rkbin once."""

from __future__ import annotations


import click
import numpy as np

from rkc.ir.atomic import atomic_output
from rkc.ir.errors import FormatError, RkcError
from rkc.ir.npu.perf import describe
from rkc.ir.rkbin import read_rkbin
from rkc.runtime.api.onnx import OnnxModel
from rkc.runtime.execute import check_feeds


def read_inputs(path: str | None) -> dict[str, np.ndarray]:
    if path is None:
        return {}
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise FormatError(f"{path}: not a readable .npz file ({exc})") from None


def write_outputs(path: str, outputs: dict[str, np.ndarray]) -> None:
    """Atomically: a temporary file next to it, then rename."""
    with atomic_output(path, suffix=".npz") as tmp:
        np.savez(tmp, **outputs)


def run_once(model_path: str, inputs: str | None, outputs: str | None, device: str, cores: int = 3,
             fp16_outputs: bool = False) -> None:
    feeds = read_inputs(inputs)
    rkbin = read_rkbin(model_path)
    program = rkbin.module.programs[0]
    if not feeds and program.inputs:
        raise RkcError(f"{model_path}: give the inputs with --inputs FILE.npz (keys: {', '.join(program.inputs)})")
    check_feeds(program, {t.name: t for t in rkbin.module.tensors}, feeds)  # before any device is opened
    with OnnxModel(rkbin, device, cores) as model:
        if model.device is not None:
            model.device.reset_counters()
        result = model.run(feeds, fp16_outputs)
        stats = model.last_run
        counters = model.device.counters if model.device is not None else None
        chaining = model.device is not None and model.device.supports_chaining
    for name, value in result.items():
        v = value.astype(np.float64) if value.size else value
        extra = f" min {v.min():.6g} max {v.max():.6g} mean {v.mean():.6g}" if value.size and value.dtype.kind in "fiu" else ""
        click.echo(f"{name}: {value.dtype}{list(value.shape)}{extra}")
    if outputs:
        write_outputs(outputs, result)
    line = (f"rkrun: {len(program.steps)} steps in {stats.seconds * 1e3:.1f} ms "
            f"(CPU {stats.cpu_seconds * 1e3:.1f} ms, NPU {stats.npu_seconds * 1e3:.1f} ms, {stats.submits} submits)")
    if counters is not None and counters.modelled_seconds:  # the simulator's performance model
        line += "; " + describe(counters.modelled_seconds, counters.tasks, counters.kicks, counters.ddr_bytes, chaining)
    click.echo(line, err=True)
