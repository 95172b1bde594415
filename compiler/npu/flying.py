"""Standalone LUT activation: a DPU-only ("flying") task.

The MRDMA reads the input straight from memory, BN maps it to the table index,
the EW stage looks the value up, OUT_CVT decodes it to fp16 and the WDMA writes
it. This is rocket-userspace's HW-validated gen_lut_activation_fp16 program
(src/npu_regcmd.c @ e0677862): the data is a flat vector seen as one surface of
8 fp16 channels by `cols` positions, one row. One field differs: that program
writes the output with size_e 0 and SURFACE_ADD = cols, rkc with the fp16
writer geometry of its other fp16 programs (size_e 1, SURFACE_ADD = 2 * cols,
formats.WRITERS); for a single-surface cube both write the same bytes under
every reading we know (docs/npu-emitters.md, open question 6).
"""

from __future__ import annotations

from rkc.compiler.npu import api, formats, lut, schedule
from rkc.compiler.npu.regfile import FLYING_BLOCKS, FLYING_ORDER, S_POINTER_FIELDS, RegisterFile, build
from rkc.ir.errors import UnsupportedError
from rkc.ir.npu import layout

BURST_LEN = 15


def lower_activation(op: api.Activation, options: api.EmitOptions) -> api.EmitResult:
    f, o = op.input, op.output
    if f.dtype != "fp16" or o.dtype != "fp16":
        raise UnsupportedError(f"{op.name}: LUT activations run on fp16 tensors")
    if f.shape != o.shape or any(t.line_bytes != t.width * layout.ATOM_BYTES for t in (f, o)):
        raise UnsupportedError(f"{op.name}: input and output must be tensors of one shape with dense rows")
    plan = lut.plan(op.function)
    atoms = f.surfaces * f.height * f.width
    tasks, jobs = [], []
    for i, (a0, b0, n) in enumerate(_flat_runs(f, o)):
        r = RegisterFile()
        r.set("DPU_S_POINTER", **S_POINTER_FIELDS)
        r.set("DPU_RDMA_RDMA_S_POINTER", **S_POINTER_FIELDS)
        r.set("DPU_FEATURE_MODE_CFG", BURST_LEN=BURST_LEN, OUTPUT_MODE=2, FLYING_MODE=1)
        fp16 = formats.PRECISION["fp16"]
        r.set("DPU_DATA_FORMAT", OUT_PRECISION=fp16, IN_PRECISION=fp16, PROC_PRECISION=fp16)
        r.address("DPU_DST_BASE_ADDR", o.buffer, o.offset + b0 * layout.ATOM_BYTES)
        r.set("DPU_DST_SURF_STRIDE", DST_SURF_STRIDE=n)
        r.set("DPU_DATA_CUBE_WIDTH", WIDTH=n - 1)
        r.set("DPU_DATA_CUBE_CHANNEL", ORIG_CHANNEL=7, CHANNEL=7)
        r.set("DPU_BS_CFG", BS_RELU_BYPASS=1, BS_MUL_BYPASS=1, BS_ALU_BYPASS=1, BS_BYPASS=1)
        wr = formats.writer("fp16", "fp16", False)
        r.set("DPU_BS_OW_CFG", SIZE_E_2=wr.size_e, SIZE_E_1=wr.size_e, SIZE_E_0=wr.size_e, OD_BYPASS=1)
        r.set("DPU_WDMA_SIZE_0", CHANNEL_WDMA=7)
        r.set("DPU_WDMA_SIZE_1", WIDTH_WDMA=n - 1)
        plan.write_bn(r)
        plan.write_out_cvt(r)
        plan.write_tables(r)
        r.set("DPU_SURFACE_ADD", SURF_ADD=n * wr.surface_add)
        r.set("DPU_RDMA_RDMA_DATA_CUBE_WIDTH", WIDTH=n - 1)
        r.set("DPU_RDMA_RDMA_DATA_CUBE_CHANNEL", CHANNEL=7)
        r.address("DPU_RDMA_RDMA_SRC_BASE_ADDR", f.buffer, f.offset + a0 * layout.ATOM_BYTES)
        r.set("DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DISABLE=1)
        r.set("DPU_RDMA_RDMA_FEATURE_MODE_CFG", IN_PRECISION=fp16, BURST_LEN=BURST_LEN, PROC_PRECISION=fp16,
              MRDMA_FP16TOFP32_EN=1, FLYING_MODE=1)
        r.set("DPU_RDMA_RDMA_WEIGHT", E_WEIGHT=1, N_WEIGHT=1, B_WEIGHT=1, M_WEIGHT=1)
        b = build(r, FLYING_ORDER, FLYING_BLOCKS)
        nbytes = n * layout.ATOM_BYTES
        counters = api.Counters(0, {"dpu_mrdma": nbytes}, {"dpu_wdma": nbytes}, "fp16")
        touches = [(f.buffer, f.offset + a0 * 16, f.offset + a0 * 16 + nbytes),
                   (o.buffer, o.offset + b0 * 16, o.offset + b0 * 16 + nbytes)]
        tasks.append(api.Task(b.array(), [api.Reloc(e, buf, off) for e, buf, off in b.relocations], None,
                              counters, f"{op.name} chunk {i}", touches))
    lanes = min(options.cores, len(tasks))
    for lane in range(lanes):
        idx = [i for i in range(len(tasks)) if schedule.lane_of(i, len(tasks), options.cores) == lane]
        jobs.append(api.JobPlan(idx, lane, [f.buffer], [o.buffer]))
    notes = [f"{op.function} LUT over {atoms} atoms: {len(tasks)} flying DPU task(s); tables in the regcmd"]
    return api.EmitResult(op, tasks, jobs, notes=notes)


def _flat_runs(f: api.Feature, o: api.Feature) -> list[tuple[int, int, int]]:
    """(input atom, output atom, atoms) of each task: one flat run over dense tensors,
    else one per surface (a map stored in taller surfaces: its rows past the map, zero,
    are neither read nor written), each cut at the flat task's atom limit."""
    per = f.height * f.width
    if f.surface_bytes == f.dense_surface_bytes and o.surface_bytes == o.dense_surface_bytes:
        per, spans = f.surfaces * per, [(0, 0)]
    else:
        spans = [(s * f.surface_bytes // layout.ATOM_BYTES, s * o.surface_bytes // layout.ATOM_BYTES)
                 for s in range(f.surfaces)]
    runs = []
    for a, b in spans:
        runs += [(a + c0, b + c0, n) for c0, n in schedule.split_evenly(per, -(-per // formats.FLAT_ATOMS_MAX), 1)]
    return runs
