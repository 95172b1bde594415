"""The probe programs, one function each, and the probe table.

Sources of programs today:
* the captured GEMM programs of gregordinary/rocket-userspace
  (../shared/golden/gemm-rocket-userspace, found through RKC_GOLDEN or beside
  the checkout) for the two chain probes; they exist only where the captures
  do;
* everything else needs rkc's own op emitters (compiler/npu, issue 4) and
  reports itself unavailable until they are in the build.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from compiler.probe import Probe, ProbeRun, ProbeUnavailable
from runtime.captured import PlacedCase, load_case
from runtime.device import Device

NEEDS_EMITTERS = "its program is built with the op emitters of compiler/npu (issue 4), not in this build yet"


def _golden_dir() -> Path:
    here = Path(__file__).resolve().parents[2]
    for c in ([Path(os.environ["RKC_GOLDEN"])] if os.environ.get("RKC_GOLDEN") else []) + \
            [here.parent / "shared" / "golden", here.parent.parent / "shared" / "golden"]:
        if (c / "gemm-rocket-userspace").is_dir():
            return c
    raise ProbeUnavailable("its program is a captured GEMM (../shared/golden, set RKC_GOLDEN), not found here")


def _captured_gemm(device: Device, name: str, chained: bool, exact: bool) -> ProbeRun:
    """Run a captured GEMM; reference = what its tasks must leave in the output
    (the capture's per-task expected bytes, laid into the output BO in order)."""
    case = load_case(_golden_dir() / "gemm-rocket-userspace" / f"{name}.json")
    placed = PlacedCase(case, device)
    try:
        for s in range(len(case.submits)):
            device.run(placed.load(s, link_tails=chained), chained=chained)
        outputs, references = {}, {}
        for handle in sorted({h for s in case.submits for j in s for h in j.out_handles}):
            outputs[f"{name} bo{handle}"] = placed.read(handle)
            if exact:
                expect = np.zeros(case.sizes[handle], np.uint8)
                for t in (t for s in case.submits for j in s for t in j.tasks):
                    if t.reference and t.reference[0] == handle:
                        _, offset, data = t.reference
                        expect[offset: offset + len(data)] = np.frombuffer(data, np.uint8)
                references[f"{name} bo{handle}"] = expect.tobytes()
        return ProbeRun(outputs, references)
    finally:
        placed.free()


def chain_int8(device: Device) -> ProbeRun:
    """16 int8 GEMM tasks (M=4, K=32, N=4096 in N tiles) in one chained kick."""
    return _captured_gemm(device, "gemm_int8_i32_m4_k32_n4096", chained=True, exact=True)


def chain_fp16(device: Device) -> ProbeRun:
    """4 fp16 GEMM tasks (M=4, K=32, N=1024) in one chained kick (the control for chain_int8)."""
    return _captured_gemm(device, "gemm_fp16_f32_m4_k32_n1024", chained=True, exact=False)


def _needs_emitters(device: Device) -> ProbeRun:
    raise ProbeUnavailable(NEEDS_EMITTERS)


gemv_m1 = strides = n_near_8192 = k_over_8192 = lut = ppu_pool = cbuf_slack = weight_reuse = _needs_emitters

PROBES: tuple[Probe, ...] = (
    Probe("gemv_m1", "Q2", "a GEMM with M=1 (a 1-row feature map) computes correctly",
          {"min_feature_rows": 1}, gemv_m1,
          "M=1 works on this board: GEMV needs no padding to 4 rows (quirks.min_feature_rows=1)",
          "M=1 is wrong on this board: keep padding GEMV to 4 rows"),
    Probe("chain_int8", "Q1", "int8 tasks after the first of a hardware-chained kick compute correctly",
          {"chained_integer_tasks": "allow"}, chain_int8,
          "int8 chains are right on this board: quirks.chained_integer_tasks can be 'allow'",
          "int8 chains are wrong on this board: keep one kick per int8 task", needs_chaining=True),
    Probe("chain_fp16", "Q1", "fp16 tasks chained in one kick compute correctly (control for chain_int8)",
          {}, chain_fp16, "fp16 chains are right on this board, as assumed",
          "fp16 chains are wrong on this board: chaining itself is broken here", needs_chaining=True),
    Probe("strides", "Q3", "CNA LINE_STRIDE/SURF_STRIDE are 16-byte units with the group-line model",
          {}, strides, "the stride model holds", "the stride model is wrong: see the differing outputs"),
    Probe("n_near_8192", "Q6", "a DPU output cube of 8191 channels in one task is written correctly",
          {"max_dpu_cube": 8192}, n_near_8192, "cubes up to 8191 work: quirks.max_dpu_cube can grow",
          "cubes near 8192 corrupt output: keep max_dpu_cube at 4096"),
    Probe("k_over_8192", "Q6", "K > 8192 split over tasks and summed gives the exact int8 product",
          {}, k_over_8192, "the K split is exact", "the K split loses precision or data"),
    Probe("lut", "", "the DPU LUT (LE/LO tables, index shift, slopes) matches the simulator's activation",
          {}, lut, "LUT activations are bit-exact with the simulator", "LUT activations differ from the model"),
    Probe("ppu_pool", "Q14", "PPU pooling on fp16 (flying from the DPU) matches the simulator",
          {}, ppu_pool, "PPU fp16 pooling holds", "PPU pooling differs from the model"),
    Probe("cbuf_slack", "Q6", "an int8 feature tile with W=1 fills its CBUF banks without a slack bank",
          {"int8_width1_slack_bank": False}, cbuf_slack,
          "no slack bank needed: quirks.int8_width1_slack_bank can be False",
          "the slack bank is needed: keep int8_width1_slack_bank"),
    Probe("weight_reuse", "", "WEIGHT_REUSE keeps weights in CBUF across the tasks of a job",
          {}, weight_reuse, "weight reuse across tasks works", "weight reuse across tasks gives wrong results"),
)
