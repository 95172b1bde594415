"""Load an LLM rkbin onto a device and run its programs (one forward step over
a chunk of tokens), through the shared loader (runtime/loader.py: BOs,
relocations) and executor (runtime/execute.py: NPU submits, layout conversions).
LLM ops run as runtime/llm/kernels.py kernels that also see the generation
state (the KV cache, the loaded model); standard ops as runtime/kernels."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rkc.ir.errors import FormatError
from rkc.ir.llm import DECODE, LlmConfig, LlmProgram, choose_program, programs_in
from rkc.ir.program import Step
from rkc.ir.rkbin import Rkbin, read_rkbin
from rkc.runtime import blas
from rkc.runtime.execute import _Run
from rkc.runtime.llm.kernel_attrs import check_layers
from rkc.runtime.llm.fused import fusers_for
from rkc.runtime.llm import fused_rows
from rkc.runtime.llm.kernels import KERNELS as LLM_KERNELS
from rkc.runtime.llm.kvcache import KVCache
from rkc.runtime.llm.prepared import BINDERS as PREPARED
from rkc.runtime.llm.tokenizer import LlmTokenizer
from rkc.runtime.llm.top_k import largest_indices
from rkc.runtime.loader import LoadedModel, needs_device
from rkc.runtime.plan import ProgramPlan, standard_binder


@dataclass
class LlmState:
    cache: KVCache
    model: LoadedModel
    valid: int  # rows of the chunk that are real tokens (the rest pad a short chunk)


class _LlmRun(_Run):
    """One program run: LLM kernels get the state; everything else as usual."""

    def __init__(self, model: LoadedModel, program, state: LlmState) -> None:
        super().__init__(model, program)
        self.state = state

    def cpu(self, step: Step) -> None:
        kernel = LLM_KERNELS.get(step.op)
        if kernel is None:
            return super().cpu(step)
        inputs = [self.read(n) if n else None for n in step.inputs]
        for name, value in zip(step.outputs, kernel(inputs, step.attrs, self.state)):
            self.write(name, value)


@dataclass
class StepTimes:
    npu_s: float = 0.0
    cpu_s: float = 0.0
    submits: int = 0


@contextlib.contextmanager
def _compile_listener(on_compile: Callable[[], None] | None):
    """Calls on_compile at numba's first compilation (its "numba:compile" event) in the block."""
    if on_compile is None:
        yield
        return
    from numba.core import event  # deferred as the kernels' modules import numba

    class Once(event.Listener):
        told = False

        def on_start(self, ev) -> None:
            if not self.told:
                self.told = True
                on_compile()

        def on_end(self, ev) -> None:
            pass

    with event.install_listener("numba:compile", Once()):
        yield


class LlmEngine:
    def __init__(self, source: "str | Path | Rkbin", device: str = "auto", cores: int = 3) -> None:
        rk = source if isinstance(source, Rkbin) else read_rkbin(source)
        meta = rk.module.metadata
        if meta.get("model_kind") != "llm":
            raise FormatError(f"{rk.path}: not an LLM rkbin")
        self.path = Path(rk.path)
        self.cfg = LlmConfig.from_dict(meta.get("llm"))
        self.precision = meta.get("precision")
        self.llm_programs = programs_in(meta, str(rk.path))  # what the compiler built, by name
        self.chunks = sorted({p.rows for p in self.llm_programs.values()})
        self.placement = meta.get("placement", {})
        if "tokenizer" not in rk.blobs:
            raise FormatError(f"{rk.path}: LLM rkbin without a tokenizer")
        self.tokenizer = LlmTokenizer.from_json(bytes(rk.blobs["tokenizer"]).decode())
        if device == "auto" and not needs_device(rk.module):
            self.model = LoadedModel(rk, None)
        else:
            from rkc.runtime.devices import open_device

            self.model = LoadedModel(rk, open_device(device, cores=cores), own_device=True)
        try:
            check_layers(rk.module, self.cfg)  # after check_module: the attributes are typed
        except BaseException:
            self.model.close()
            raise
        self.programs = {p.name: p for p in rk.module.programs}
        absent = sorted(set(self.llm_programs) - set(self.programs))
        if absent:
            self.model.close()
            raise FormatError(f"{rk.path}: the program table names {absent[0]!r:.40}, which the module lacks")
        self.times = StepTimes()
        self.plans = self._plans()

    @property
    def device(self):
        return self.model.device

    def new_cache(self, n_ctx: int) -> KVCache:
        return KVCache(self.cfg.n_layer, self.cfg.cache_windows(), n_ctx)

    def program_for(self, rows: int, all_logits: bool) -> LlmProgram:
        """The file's program for a chunk of `rows` tokens (every row's logits or the last)."""
        return choose_program(self.llm_programs, rows, all_logits)

    def npu_seconds(self, all_logits: bool) -> dict[int, float] | None:
        """Each chunk size's modelled NPU seconds a run (decode's for 1) of the
        programs returning every row's logits or the last one's, as the
        compiler recorded them; None when any is missing (an older rkbin)."""
        out = {}
        for rows in self.chunks:
            npu_s = self.program_for(rows, all_logits).npu_s
            if npu_s is None:
                return None
            out[rows] = npu_s
        return out

    def _plans(self) -> dict:
        """Every program prepared once (runtime/plan.py), sharing one state."""
        self._state = LlmState(self.new_cache(1), self.model, 1)
        state, plans = self._state, {}

        def bind(step, consts):
            kernel = LLM_KERNELS.get(step.op)
            if kernel is None:
                return standard_binder(step, consts)
            prepared = PREPARED[step.op](step, consts, state) if step.op in PREPARED else None
            if prepared is not None:
                return prepared
            attrs = step.attrs
            return lambda inputs: kernel(inputs, attrs, state)

        for name, prog in self.programs.items():
            plans[name] = ProgramPlan(self.model, prog, bind, unchecked=frozenset(LLM_KERNELS), fusers=[*fusers_for(state), *fused_rows.fusers(state)])
        return plans

    def _feeds(self, program: str, tokens: np.ndarray, positions: np.ndarray) -> tuple[int, dict]:
        tensor = self.llm_programs[program].tensor
        rows = self.model.tensors[tensor("tokens")].shape[0]
        valid = len(tokens)
        if valid > rows:
            raise FormatError(f"program {program} takes {rows} tokens, got {valid}")
        pad = rows - valid
        tokens = np.concatenate([np.asarray(tokens, np.int32), np.zeros(pad, np.int32)])
        positions = np.asarray(positions, np.int32)
        positions = np.concatenate([positions, positions[-1] + 1 + np.arange(pad, dtype=np.int32)])
        return valid, {tensor("tokens"): tokens, tensor("positions"): positions}

    def run(self, program: str, tokens: np.ndarray, positions: np.ndarray, cache: KVCache) -> np.ndarray:
        """Logits of the chunk (every row, or the last real row for prefill
        programs). Fewer tokens than the program's rows are padded: pad rows
        never enter the KV cache and their logits are dropped."""
        import time

        plan = self.plans[program]
        valid, feeds = self._feeds(program, tokens, positions)
        self._state.cache, self._state.valid = cache, valid
        t, npu0 = time.perf_counter(), plan.npu_seconds[0]
        logits = np.asarray(plan.run([feeds[n] for n in plan.program.inputs])[0])
        npu = plan.npu_seconds[0] - npu0
        self.times.npu_s += npu
        self.times.cpu_s += time.perf_counter() - t - npu
        self.times.submits += plan.submits
        return logits if logits.shape[0] == 1 else logits[:valid]

    def warm_up(self, on_compile: Callable[[], None] | None = None) -> None:
        """Compile (or load from numba's cache) every host kernel generation
        calls, now rather than in a request: each prefill program's host steps
        run once from an empty KV cache, the smallest again over a filled one,
        then decode's, all on a scratch cache and without NPU submits
        (ProgramPlan.run_host_steps); then the sampler's top-k. A cold cache compiled for ~25 s in the first
        request of Gemma 3 270M; a warm one still loaded for ~0.8 s
        (docs/notes/2026-12-06-first-request.md). `on_compile`: called once, when
        the first kernel is compiled (not when all load from the cache), to say so."""
        with _compile_listener(on_compile):
            self._warm_up()

    def _warm_up(self) -> None:
        prefill = sorted((p for p in self.llm_programs.values() if p.last_row_only), key=lambda p: p.rows)
        runs = [(p, 0) for p in prefill[1:]]
        if prefill:
            runs += [(prefill[0], 0), (prefill[0], prefill[0].rows)]
        start = runs[-1][1] + runs[-1][0].rows if runs else 0
        runs.append((self.llm_programs[DECODE], start))
        cache = self.new_cache(max(start + 1, *(p.rows for p, _ in runs)))
        for program, pos in runs:
            if pos == 0:
                cache.reset()
            valid, feeds = self._feeds(program.name, np.zeros(program.rows, np.int32),
                                       np.arange(pos, pos + program.rows, dtype=np.int32))
            self._state.cache, self._state.valid = cache, valid
            plan = self.plans[program.name]
            plan.run_host_steps([feeds[n] for n in plan.program.inputs])
        for dtype in (np.float32, np.float64):  # the sampler's top-k: the logits' row, and logprobs' float64 one
            largest_indices(np.arange(64, dtype=dtype), 8)

    def run_interpreted(self, program: str, tokens: np.ndarray, positions: np.ndarray,
                        cache: KVCache) -> np.ndarray:
        """`run` through the step-by-step interpreter (runtime/execute.py): the
        reference the prepared plans are checked against."""
        prog = self.programs[program]
        valid, feeds = self._feeds(program, tokens, positions)
        run = _LlmRun(self.model, prog, LlmState(cache, self.model, valid))
        for name, value in feeds.items():
            run.write(name, value)
        with blas.one_thread() as run.blas:  # as the plans run host kernels (runtime/blas.py)
            self._interpret(run, prog)
        logits = np.asarray(run.read(prog.outputs[0]))
        return logits if logits.shape[0] == 1 else logits[:valid]

    def _interpret(self, run: _LlmRun, prog) -> None:
        import time

        for i, step in enumerate(prog.steps):
            t = time.perf_counter()
            if step.kind == "cpu":
                run.cpu(step)
                self.times.cpu_s += time.perf_counter() - t
            else:
                run.npu(step)
                self.times.npu_s += time.perf_counter() - t
                self.times.submits += 1
            for name in run.schedule.dead[i]:  # host tensors past their last reader, as run_program frees them
                run.env.pop(name, None)

    def close(self) -> None:
        self.model.close()

    def stats(self) -> dict[str, Any]:
        return {"npu_s": self.times.npu_s, "cpu_s": self.times.cpu_s, "submits": self.times.submits}
