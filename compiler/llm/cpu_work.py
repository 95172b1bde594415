"""What an LLM program leaves on the CPU, why, and whether the NPU decode can
beat a CPU decode once that host work is paid for (`rkc inspect`, issue 13).

`WHY_ON_CPU` is the one table of reasons: per CPU op, the boundary it sits at.
"hard": the NPU has no way to do it (facts from docs/hw-matmul.md §5: the DPU's
BS/BN operands are per channel, its EW stage is per element, no public recipe
runs a row reduction or softmax on it); "movable": an NPU stage could take it
into the neighbouring segment (issue 13 item 5), it is on the CPU because the
compiler does not place it there yet; "edge": a conversion that exists because
a neighbour is on the CPU; "free": no arithmetic.

Host costs are measured, not assumed: `bench/llm.py --host-costs FILE` writes
the host microseconds per call of each step kind of a decode token (null
device), the host time of whole prefill chunks (a step's cost there grows
with its rows, so chunks are measured whole), and llama.cpp's CPU decode time
from the same run; `rkc inspect --host-costs FILE` applies them to this
file's decode program and prefill chunks.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rkc.ir.errors import FormatError
from rkc.ir.program import Program

HARD, MOVABLE, EDGE, FREE = "hard", "movable", "edge", "free"

_LOOKUP = (HARD, "embedding lookup by token id (an indexed row read, no NPU op)")

# the FFN's activation and gating multiply stay between int8/int4 products only:
# fp16 FFNs run them in their products' epilogues (compiler/llm/ffn_fusion.py)
_INT8_FFN = ("FFN activation / gating of int8 products: the int32 sums need the per-token row scale "
             "first (DequantizeRows) and the LUT on an integer datapath is undocumented (Q22); "
             "fp16 FFNs run them on the DPU (LUT, EW multiply)")

# op -> (boundary, why); see the module docstring for the kinds
WHY_ON_CPU: dict[str, tuple[str, str]] = {
    "GatherPacked": _LOOKUP, "GatherRows": _LOOKUP, "Gather": _LOOKUP,
    "Attention": (HARD, "reads and appends the KV cache; softmax needs a row max and sum "
                        "(no public on-NPU recipe; measured data-movement-bound where tried)"),
    "RMSNorm": (HARD, "mean of squares over the row: a reduction across channels (BS/BN are per channel)"),
    "QuantizeRows": (HARD, "per-token int8 scale: max |x| over the row before the product "
                           "(and its rotation), a row reduction"),
    "DequantizeRows": (HARD, "per-token row scale: BS/BN scale per channel only, and (acc x scale) >> shift "
                             "stays integer"),
    "QuantizeNibbles": (HARD, "per-token int8 scale (a row reduction, as QuantizeRows), then each code split "
                              "into two int4 nibble rows for the int4 GEMM"),
    "CombineInt4": (HARD, "int16 partials per K group times their group scales and the row scale, summed "
                          "(the int4 path's DPU passes raw sums only, Q23)"),
    "RoPE": (HARD, "position-dependent rotation of channel pairs (a per-token, per-pair mix)"),
    "SumPartials": (MOVABLE, "fp16 partial sums of a split K: the conv-main EW add could sum them"),
    "Add": (MOVABLE, "residual add: the DPU's EW stage adds a second tensor (conv-main or a flying task)"),
    "Mul": (HARD, _INT8_FFN),
    "GeluTanh": (HARD, _INT8_FFN),
    "SiLU": (HARD, _INT8_FFN),
    "Tanh": (MOVABLE, "activation: the DPU's LUT"),
    "Scale": (MOVABLE, "constant scale: a BS/BN multiplier"),
    "Linear": (MOVABLE, "a product the compiler placed on the CPU"),
    "Reshape": (FREE, "a view of the same values"),
    "TakeLast": (FREE, "a view of the last real row"),
    "Cast": (EDGE, "fp16 NPU tensor to fp32 host one and back, at a segment's edge"),
}
UNKNOWN = (MOVABLE, "no reason recorded (compiler/llm/cpu_work.py)")

# the host's own steps around the kernels, as bench/llm.py's profile labels them
SUBMIT, BRACKET = "NPU submit", "CPU access bracket"
# issue 13's target: a prefill chunk's host time at most this share of its modelled NPU time
PREFILL_HOST_SHARE = 0.10


def cpu_ops(program: Program) -> Counter:
    """CPU steps of one run of `program`, by op."""
    return Counter(s.op for s in program.steps if s.kind == "cpu")


def cpu_steps(program: Program) -> int:
    """CPU steps of one run of `program`: every step the runtime runs on the
    host (graph ops, segment-edge conversions, quantization), the one count
    the compile log, `rkc inspect` and the host-cost estimate use."""
    return sum(cpu_ops(program).values())


def stretches(program: Program) -> int:
    """Runs of CPU steps between NPU steps (each one CPU access bracket)."""
    n, inside = 0, False
    for s in program.steps:
        if s.kind == "cpu" and not inside:
            n += 1
        inside = s.kind == "cpu"
    return n


@dataclass
class HostCosts:
    """Measured by bench/llm.py --host-costs on one machine, for one precision."""

    us_per_call: dict[str, float]
    cpu_decode_s: float  # the faster of llama.cpp's 1- and 2-thread decode, same run
    source: str
    prefill_s: dict[int, float] = field(default_factory=dict)  # chunk rows -> host seconds of one chunk

    def host_s(self, program: Program) -> tuple[float, list[str]]:
        """Host seconds of one run of `program` and the step kinds with no measured cost."""
        total, missing = 0.0, []
        counts = {**cpu_ops(program), SUBMIT: sum(1 for s in program.steps if s.kind == "npu"),
                  BRACKET: 2 * stretches(program)}
        for op, n in counts.items():
            us = self.us_per_call.get(op)
            if us is None:
                missing.append(op)
            else:
                total += n * us * 1e-6
        return total, missing


def load_host_costs(path: str | Path, precision: str) -> HostCosts:
    try:
        data = json.loads(Path(path).read_text())
        row = data["host_costs"][precision]
        return HostCosts({k: float(v) for k, v in row["us_per_call"].items()}, float(row["cpu_decode_s"]),
                         f"{path} ({data.get('model', '?')}, measured by bench/llm.py)",
                         {int(k): float(v) for k, v in row.get("prefill_host_s", {}).items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise FormatError(f"{path}: not a bench/llm.py --host-costs file with {precision} figures ({e})") from None


def cpu_lines(program: Program, npu_s: float, costs: HostCosts | None) -> list[str]:
    """What stays on the CPU in one run of `program` and why; with measured
    host costs, the projected decode against the CPU decode."""
    counts = cpu_ops(program)
    lines = [f"on the CPU per decode token: {cpu_steps(program)} steps in {stretches(program)} stretches "
             "between NPU segments"]
    for kind in (HARD, MOVABLE, EDGE, FREE):
        rows = [(op, n) for op, n in counts.most_common() if WHY_ON_CPU.get(op, UNKNOWN)[0] == kind]
        if rows:
            lines.append(f"  {kind}:")
            lines += [f"    {op} x{n}: {WHY_ON_CPU.get(op, UNKNOWN)[1]}" for op, n in rows]
    if costs is None:
        lines.append("  host cost not measured here (rkc inspect --host-costs FILE, from bench/llm.py --host-costs)")
        return lines
    host, missing = costs.host_s(program)
    projected = npu_s + host
    cpu = costs.cpu_decode_s
    lines.append(f"  host {host * 1e3:.2f} ms per token at the measured costs ({costs.source})"
                 + (f"; no cost for {', '.join(missing)}" if missing else ""))
    if npu_s >= cpu:
        verdict = (f"the NPU cannot beat the CPU decode here: its modelled time alone ({npu_s * 1e3:.2f} ms) is "
                   f"not below llama.cpp's {cpu * 1e3:.2f} ms per token")
    elif projected >= cpu:
        verdict = (f"the NPU does not beat the CPU decode at these host costs: {npu_s * 1e3:.2f} ms NPU + "
                   f"{host * 1e3:.2f} ms host >= llama.cpp's {cpu * 1e3:.2f} ms per token")
    else:
        verdict = (f"the NPU decode beats the CPU's: {npu_s * 1e3:.2f} ms NPU + {host * 1e3:.2f} ms host = "
                   f"{1 / projected:.1f} tokens/s vs llama.cpp's {1 / cpu:.1f}")
    lines.append("  " + verdict)
    return lines


def prefill_lines(prefill: dict[str, dict], costs: HostCosts | None) -> list[str]:
    """Per prefill chunk this file has (`prefill`: report.figures' "prefill",
    modelled NPU seconds by rows) and the costs file measured: host against
    NPU time, and whether the host keeps within PREFILL_HOST_SHARE of it."""
    if costs is None or not costs.prefill_s:
        return []
    lines = []
    for rows, p in sorted(prefill.items(), key=lambda kv: int(kv[0])):
        host = costs.prefill_s.get(int(rows))
        if host is None:
            continue
        npu = p["modelled_npu_s"]
        share = host / npu if npu else float("inf")
        verdict = (f"within the {PREFILL_HOST_SHARE:.0%} target: the chunk runs at the NPU's pace" if
                   share <= PREFILL_HOST_SHARE else
                   f"above the {PREFILL_HOST_SHARE:.0%} target: the host sets the pace, "
                   f"{int(rows) / (npu + host):.0f} tokens/s against the NPU's {int(rows) / npu:.0f} "
                   "(docs/llm.md: the host's floor)")
        lines.append(f"  prefill {rows}: host {host * 1e3:.1f} ms per chunk (measured) vs NPU {npu * 1e3:.1f} ms "
                     f"(modelled): {share:.1f}x, {verdict}")
    return lines
