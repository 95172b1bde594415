"""Register programming of rkc's own emitters, checked without a simulator:

* for every task of the rocket-userspace GEMM captures, rkc's single-tile GEMM of
  the same tile shape writes the same registers in the same order with the same
  field values (addresses aside, which are compared by register and buffer);
* tiling, CBUF plans, reuse bits, lanes, field limits, assembly and linking.
"""

import json
from functools import lru_cache

import numpy as np
import pytest

from rkc.compiler.npu import api
from rkc.compiler.npu.dispatch import emit
from rkc.compiler.npu.assemble import assemble
from golden_cases import case_files
from rkc.ir.errors import UnsupportedError
from rkc.ir.npu import hw
from rkc.ir.npu.regcmd import TAIL_ENTRIES, decode, link_amount, split, write_entry
from rkc.ir.npu.registers import register

ONE_TILE = api.EmitOptions(cores=1, n_tile_max=8192, k_tile_max=16384)
ROLES = {"CNA_FEATURE_DATA_ADDR": "A", "CNA_DCOMP_ADDR0": "B", "DPU_DST_BASE_ADDR": "C"}


@lru_cache(maxsize=None)
def _gemm_tasks():
    out = []
    for path in case_files("gemm-rocket-userspace"):
        case = json.loads(path.read_text())
        if case["status"] != "ok":
            continue
        p = case["params"]
        for s in case["submits"]:
            for job in s["jobs"]:
                for t in job["tasks"]:
                    out.append((path.name, p["dtype"], p["out_dtype"], t))
    return out


def _single_tile(dtype, out, m, k, n):
    b = np.zeros((k, n), np.int8 if dtype == "int8" else np.float16)
    op = api.Gemm(api.Feature.gemm("A", 0, m, k, dtype), b, api.Feature.gemm("C", 0, m, n, out), m, name="g")
    r = emit(op, ONE_TILE)
    assert len(r.tasks) == 1, r.notes
    return r.tasks[0]


def test_gemm_tasks_match_the_rocket_userspace_captures_field_by_field():
    checked = 0
    for name, dtype, out, t in _gemm_tasks():
        tile = t["tile"]
        mine = _single_tile(dtype, out, tile["Mtile"], tile["Ktile"], tile["Ntile"])
        theirs = [int(h, 16) for h in t["regcmd"]]
        assert len(theirs) == mine.count == t["regcmd_count"], name
        relocs = {r.entry: r.buffer for r in mine.relocations}
        their_relocs = {r["entry"]: ROLES[r["reg"]] for r in t["relocations"]}
        assert {e: b.replace("g.weights", "B") for e, b in relocs.items()} == their_relocs, name
        for i, (d_t, d_m) in enumerate(zip(decode(theirs), decode(mine.regcmd))):
            where = f"{name} task {tile['task_index_global']} entry {i} {d_t.name}"
            assert d_t.name == d_m.name, where
            if i in relocs:
                continue
            for field, value in d_t.fields.items():
                assert d_m.fields[field] == value, f"{where}.{field}: capture {value:#x}, rkc {d_m.fields[field]:#x}"
            assert d_t.raw == d_m.raw, where
        checked += 1
    assert checked >= 250


def test_gemm_a_b_c_layouts_agree_with_the_capture_formulas():
    """The buffers rkc reads/writes for a tile follow the capture README's formulas:
    A (K/C2, M, C2), B (N/KG, K/32, KG, 32), C (N/C2o, M, C2o) with surface M*16."""
    from rkc.ir.npu import layout

    rng = np.random.default_rng(0)
    for dtype, c2, kg in (("int8", 16, 32), ("fp16", 8, 16)):
        m, k, n = 8, 96, 2 * kg
        a = rng.integers(-9, 9, (m, k)).astype(np.int8 if dtype == "int8" else np.float16)
        b = rng.integers(-9, 9, (k, n)).astype(a.dtype)
        op = api.Gemm(api.Feature.gemm("A", 0, m, k, dtype), b, api.Feature.gemm("C", 0, m, n, "fp32"
                      if dtype == "fp16" else "int32"), m, name="g")
        r = emit(op, ONE_TILE)
        wb = np.frombuffer(r.constants[0].data, a.dtype)
        for ni, ki in [(0, 0), (n - 1, k - 1), (kg + 3, 33), (5, 70)]:
            assert wb[(ni // kg) * kg * k + (ki // 32) * 32 * kg + (ni % kg) * 32 + ki % 32] == b[ki, ni]
        fa = layout.pack_gemm_a(a).reshape(-1)
        for mi, ki in [(0, 0), (m - 1, k - 1), (3, 40)]:
            assert fa[(ki // c2) * m * c2 + mi * c2 + ki % c2] == a[mi, ki]
        dst = [d for d in decode(r.tasks[0].regcmd) if d.name == "DPU_DST_SURF_STRIDE"][0]
        assert dst.fields["DST_SURF_STRIDE"] * 16 == m * 16


def _fields(task, name):
    return next(d.fields for d in decode(task.regcmd) if d.name == name)


def test_m1_decode_reads_four_rows():
    a = api.Feature.gemm("A", 0, 1, 640, "int8")
    assert (a.channels, a.height, a.width) == (640, 4, 1)
    op = api.Gemm(a, np.zeros((640, 256), np.int8), api.Feature.gemm("C", 0, 1, 256, "int32"), 1)
    for t in emit(op).tasks:
        assert _fields(t, "CNA_DATA_SIZE0")["DATAIN_HEIGHT"] == 4


def test_large_n_splits_into_tasks_under_the_channel_limit_and_spreads_over_three_cores():
    n = 262144  # a Gemma-3 LM head
    op = api.Gemm(api.Feature.gemm("A", 0, 1, 640, "int8"), np.zeros((640, n), np.int8),
                  api.Feature.gemm("C", 0, 1, n, "int32"), 1, name="head")
    r = emit(op)
    assert {j.lane for j in r.jobs} == {0, 1, 2}
    covered = 0
    for t in r.tasks:
        ch = _fields(t, "DPU_DATA_CUBE_CHANNEL")
        assert ch["CHANNEL"] + 1 <= 4096
        covered += ch["ORIG_CHANNEL"] + 1
    assert covered == n
    assert sum(len(j.tasks) for j in r.jobs) == len(r.tasks)


def test_large_k_splits_and_int8_partials_are_flagged_for_the_cpu():
    k = 20000
    op = api.Gemm(api.Feature.gemm("A", 0, 8, k, "int8"), np.zeros((k, 64), np.int8),
                  api.Feature.gemm("C", 0, 8, 64, "int32"), 8, name="g")
    r = emit(op)
    assert r.cpu and r.cpu[0].kind == "sum_partials" and len(r.cpu[0].inputs) == 3
    assert {s.name for s in r.scratch} == {f.buffer for f in r.cpu[0].inputs}
    assert all(_fields(t, "CNA_DATA_SIZE1")["DATAIN_CHANNEL"] <= 8192 for t in r.tasks)
    with pytest.raises(UnsupportedError, match="partial sums"):
        emit(op, api.EmitOptions(allow_cpu_finish=False))


def test_large_k_fp16_accumulates_on_the_npu():
    k = 20000
    op = api.Gemm(api.Feature.gemm("A", 0, 64, k, "fp16"), np.zeros((k, 64), np.float16),
                  api.Feature.gemm("C", 0, 64, 64, "fp32"), 64, name="g")
    r = emit(op)
    assert not r.cpu
    ew = [_fields(t, "DPU_EW_CFG") for t in r.tasks]
    assert sum(not f["EW_BYPASS"] for f in ew) == len(r.tasks) - len(r.tasks) // 5  # all but each first K tile
    # the partial chain of one (m, n) tile stays on one core, in K order
    for job in r.jobs:
        labels = [r.tasks[t].label for t in job.tasks]
        assert labels == sorted(labels, key=lambda s: (s.split()[1:3], s.split()[3]))


def test_weight_reuse_across_m_tiles_and_data_reuse_across_n_tiles():
    # many rows, small weights: one core walks M tiles with the weights left in CBUF
    op = api.Gemm(api.Feature.gemm("A", 0, 4096, 1024, "int8"), np.zeros((1024, 64), np.int8),
                  api.Feature.gemm("C", 0, 4096, 64, "int32"), 4096, name="g")
    r = emit(op, api.EmitOptions(cores=1))
    flags = [(t.cbuf.weight_reuse, t.cbuf.data_reuse) for t in r.tasks]
    assert flags[0] == (False, False) and all(f == (True, False) for f in flags[1:])
    assert all(_fields(t, "CNA_CBUF_CON0")["WEIGHT_REUSE"] == 1 for t in r.tasks[1:])
    # one M tile, many N tiles on one core: the feature stays
    op = api.Gemm(api.Feature.gemm("A", 0, 64, 1024, "int8"), np.zeros((1024, 8192), np.int8),
                  api.Feature.gemm("C", 0, 64, 8192, "int32"), 64, name="g")
    r = emit(op, api.EmitOptions(cores=1, n_tile_max=1024))
    assert [t.cbuf.data_reuse for t in r.tasks] == [False] + [True] * (len(r.tasks) - 1)
    assert all(_fields(t, "CNA_CBUF_CON0")["DATA_REUSE"] == 1 for t in r.tasks[1:])


@pytest.mark.parametrize("dtype", ["int8", "fp16"])
def test_cbuf_plans_fit_and_int8_keeps_a_slack_bank(dtype):
    for m, k in [(1, 640), (32, 2048), (512, 640), (128, 8192), (300, 1000)]:
        op = api.Gemm(api.Feature.gemm("A", 0, m, k, dtype), np.zeros((k, 256), api.NUMPY[dtype]),
                      api.Feature.gemm("C", 0, m, 256, "int32" if dtype == "int8" else "fp32"), m, name="g")
        for t in emit(op).tasks:
            c = _fields(t, "CNA_CBUF_CON0")
            assert c["DATA_BANK"] + c["WEIGHT_BANK"] <= hw.CBUF_BANKS and c["WEIGHT_BANK"] >= 1
            feature_bytes = t.cbuf.data_bytes
            need = -(-feature_bytes // hw.CBUF_BANK_BYTES) + (1 if dtype == "int8" else 0)
            assert c["DATA_BANK"] >= need


def test_hardware_question_options_default_to_the_safe_readings():
    """min_input_rows and int8_slack_banks exist for `rkc probe`: by default a
    1-row map is refused and an int8 tile keeps a slack bank; set, the emitter
    builds exactly the program in question (and nothing else changes)."""
    x, y = api.Feature("x", 0, 64, 1, 1, "int8"), api.Feature("y", 0, 32, 1, 1, "int32")
    gemv = api.Conv2D(x, np.ones((32, 1, 1, 64), np.int8), y, name="gemv")
    with pytest.raises(UnsupportedError, match="the input has 1 rows; the NPU needs at least 4"):
        emit(gemv)
    (t,) = emit(gemv, api.EmitOptions(min_input_rows=1)).tasks
    assert _fields(t, "CNA_DATA_SIZE0")["DATAIN_HEIGHT"] == 1
    # a 6-row map: the default extends a 1-row tile to 4 input rows, min_input_rows=1 does not
    x6, y6 = api.Feature("x", 0, 16, 6, 8, "int8"), api.Feature("y", 0, 16, 6, 8, "int32")
    conv = api.Conv2D(x6, np.ones((16, 1, 1, 16), np.int8), y6, name="c")
    rows = {opt: [_fields(t, "CNA_DATA_SIZE0")["DATAIN_HEIGHT"] for t in emit(conv, opt).tasks]
            for opt in (api.EmitOptions(cores=3), api.EmitOptions(cores=3, min_input_rows=1))}
    assert min(rows[api.EmitOptions(cores=3)]) >= 4 and min(rows[api.EmitOptions(cores=3, min_input_rows=1)]) < 4

    a, c = api.Feature.gemm("A", 0, 600, 1024, "int8"), api.Feature.gemm("C", 0, 600, 64, "int32")
    gemm = api.Gemm(a, np.zeros((1024, 64), np.int8), c, 600, name="g")
    for slack in (1, 0):
        for t in emit(gemm, api.EmitOptions(cores=1, int8_slack_banks=slack)).tasks:
            assert _fields(t, "CNA_CBUF_CON0")["DATA_BANK"] == -(-t.cbuf.data_bytes // hw.CBUF_BANK_BYTES) + slack
    assert api.DEFAULT_OPTIONS.min_input_rows == 4 and api.DEFAULT_OPTIONS.int8_slack_banks == 1


def test_conv_rows_split_with_halo_and_pads_only_at_the_edges():
    x = api.Feature("x", 0, 32, 112, 112, "int8", api.Quant(0.1, 0))
    y = api.Feature("y", 0, 32, 112, 112, "int8", api.Quant(0.2, 0))
    op = api.Conv2D(x, np.zeros((32, 3, 3, 32), np.int8), y, (1, 1), (1, 1, 1, 1), weight_quant=api.Quant(0.01))
    r = emit(op)
    assert len(r.tasks) >= 3 and {j.lane for j in r.jobs} == {0, 1, 2}
    rows = 0
    for i, t in enumerate(r.tasks):
        pad = _fields(t, "CNA_PAD_CON0")
        assert pad["PAD_LEFT"] == 1 and pad["PAD_TOP"] == (1 if i == 0 else 0)
        out_rows = _fields(t, "DPU_DATA_CUBE_HEIGHT")["HEIGHT"] + 1
        in_rows = _fields(t, "CNA_DATA_SIZE0")["DATAIN_HEIGHT"]
        assert in_rows >= out_rows + 2 - (1 if i in (0, len(r.tasks) - 1) else 0)
        dst = next(rel for rel in t.relocations if rel.buffer == "y")
        assert dst.offset == rows * 112 * 16
        rows += out_rows
    assert rows == 112


@pytest.mark.parametrize("bad, match", [
    (dict(width=2048), "input width = 2048"),
    (dict(stride=8), "stride = 8"),
    (dict(pad=16), "padding = 16"),
    (dict(kernel=33), "kernel size = 33"),
])
def test_field_limits_are_refused_not_truncated(bad, match):
    w = bad.get("width", 40)
    k = bad.get("kernel", 3)
    s = bad.get("stride", 1)
    p = bad.get("pad", 0)
    x = api.Feature("x", 0, 16, 40, w, "fp16")
    oh, ow = (40 + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    y = api.Feature("y", 0, 16, max(oh, 1), max(ow, 1), "fp16")
    op = api.Conv2D(x, np.zeros((16, k, k, 16), np.float16), y, (s, s), (p, p, p, p))
    with pytest.raises(UnsupportedError, match=match):
        emit(op)


def test_maps_of_fewer_than_four_rows_are_refused():
    x = api.Feature("x", 0, 16, 3, 16, "fp16")
    y = api.Feature("y", 0, 16, 3, 16, "fp16")
    with pytest.raises(UnsupportedError, match="at least 4"):
        emit(api.Conv2D(x, np.zeros((16, 1, 1, 16), np.float16), y))


def test_assemble_links_tails_within_each_job_and_aligns_tasks():
    op = api.Gemm(api.Feature.gemm("A", 0, 64, 256, "int8"), np.zeros((256, 1024), np.int8),
                  api.Feature.gemm("C", 0, 64, 1024, "int32"), 64, name="g")
    r = emit(op, api.EmitOptions(n_tile_max=128))
    asm = assemble([r], align=64)
    relocs = {(rel.entry): rel for rel in asm.relocations}
    for job in asm.jobs:
        assert len(job.tasks) > 1
        for t, nxt in zip(job.tasks, job.tasks[1:]):
            assert (t.entry * 8) % 64 == 0
            tail = asm.entries[t.entry + t.count - 4: t.entry + t.count]
            link = relocs[t.entry + t.count - 4]
            assert (link.target, link.offset) == ("regcmd", nxt.entry * 8)
            assert int(tail[0]) == write_entry("PC_BASE_ADDRESS", 0)
            assert int(tail[1]) == write_entry("PC_REGISTER_AMOUNTS", link_amount(nxt.count))
        last = job.tasks[-1]
        end = asm.entries[last.entry + last.count - 4: last.entry + last.count]
        assert int(end[0]) == 0 and split(int(end[1]))[2] == 0 and last.entry + last.count - 4 not in relocs
    assert {j.lane for j in asm.jobs} == {0, 1, 2}
    assert all(rel.region == "regcmd" for rel in asm.relocations)
    refs = [ref for job in asm.jobs for ref in job.tasks]
    assert sorted(x.entry for x in refs) == sorted(x.entry for x in asm.task_refs[0])


def test_assemble_resolves_buffers_to_regions_and_merges_single_job_ops():
    ops = []
    for i in range(3):
        ops.append(emit(api.Gemm(api.Feature.gemm(f"t{i}", 0, 4, 64, "fp16"), np.zeros((64, 32), np.float16),
                                     api.Feature.gemm(f"t{i + 1}", 0, 4, 32, "fp16"), 4, name=f"g{i}"),
                            api.EmitOptions(cores=1)))
    places = {f"t{i}": ("act", 4096 * i) for i in range(4)}
    asm = assemble(ops, merge_jobs=True, resolve=lambda b: places.get(b, ("weights", 0)))
    assert len(asm.jobs) == 1 and len(asm.jobs[0].tasks) == 3
    feat = [rel for rel in asm.relocations if rel.target == "act"]
    assert {rel.offset for rel in feat} == {0, 4096, 8192, 12288}
    assert asm.jobs[0].writes == ["act"] and "act" not in asm.jobs[0].reads


def test_every_emitted_entry_decodes_cleanly():
    rng = np.random.default_rng(0)
    results = [
        emit(api.Gemm(api.Feature.gemm("A", 0, 5, 100, "int8", api.Quant(0.1, 3)),
                          rng.integers(-5, 5, (100, 40)).astype(np.int8),
                          api.Feature.gemm("C", 0, 5, 40, "int8", api.Quant(0.3, -2)), 5, api.Quant(0.02),
                          api.Epilogue(bias=np.arange(40), activation="relu6"), "g")),
        emit(api.Activation(api.Feature("x", 0, 16, 8, 8, "fp16"), api.Feature("y", 0, 16, 8, 8, "fp16"),
                                "silu")),
        emit(api.Pool(api.Feature("x", 0, 16, 8, 8, "fp16"), api.Feature("y", 0, 16, 4, 4, "fp16"),
                          "avg", (2, 2), (2, 2)), api.EmitOptions(ppu_completes=True)),
        emit(api.Pool(api.Feature("x", 0, 32, 8, 8, "fp16"), api.Feature("y", 0, 32, 4, 4, "fp16"),
                          "avg", (2, 2), (2, 2))),
    ]
    for r in results:
        for t in r.tasks:
            for d in decode(t.regcmd):
                assert not d.problems, (t.label, d.index, d.problems)
            assert t.count <= 2 * (0xFFFF + 1)
            assert t.regcmd[-2] == 0x0041000000000000


def test_lut_tables_follow_the_function():
    from rkc.compiler.npu import lut

    p = lut.plan("sigmoid")
    assert p.le.shape == p.lo.shape == (513,)
    x = np.linspace(-8, 8, 1025)
    q = np.concatenate([p.le, p.lo[1:]]).astype(np.float64) / 32768
    assert np.abs(q - 1 / (1 + np.exp(-x))).max() < 1e-4
    assert p.le.min() >= 1  # a zero entry decodes as ~4 on silicon
    r = emit(api.Activation(api.Feature("x", 0, 8, 4, 4, "fp16"), api.Feature("y", 0, 8, 4, 4, "fp16"), "tanh"))
    writes = [d for d in decode(r.tasks[0].regcmd) if d.name == "DPU_LUT_ACCESS_DATA"]
    assert len(writes) == 2 * 513
    assert _fields(r.tasks[0], "DPU_OUT_CVT_SHIFT") == {**_fields(r.tasks[0], "DPU_OUT_CVT_SHIFT"),
                                                        "CVT_TYPE": 1, "MINUS_EXP": 14}


PPU = api.EmitOptions(ppu_completes=True)


def test_global_pool_decomposes_into_exact_windows():
    r = emit(api.Pool(api.Feature("x", 0, 64, 56, 56, "fp16"), api.Feature("y", 0, 64, 1, 1, "fp16"), "avg"),
                 PPU)
    kernels = [(_fields(t, "PPU_POOLING_KERNEL_CFG")["KERNEL_HEIGHT"] + 1) for t in r.tasks]
    assert np.prod(kernels) == 56 and max(kernels) <= 16
    with pytest.raises(UnsupportedError, match="no exact split"):
        emit(api.Pool(api.Feature("x", 0, 64, 17, 17, "fp16"), api.Feature("y", 0, 64, 1, 1, "fp16"), "avg"),
                 PPU)


def test_pooling_under_stock_rocket_stays_dpu_terminated():
    x, y = api.Feature("x", 0, 32, 8, 8, "fp16"), api.Feature("y", 0, 32, 4, 4, "fp16")
    r = emit(api.Pool(x, y, "avg", (2, 2), (2, 2)))
    assert all(split(int(t.regcmd[-1]))[2] == 0x1D for t in r.tasks)  # CNA+CORE+DPU+DPU_RDMA
    assert _fields(r.tasks[0], "CORE_MISC_CFG")["DW_EN"] == 1
    taps = emit(api.Pool(x, y, "max", (2, 2), (2, 2)))  # one-hot depthwise convolutions, DPU-terminated
    assert all(split(int(t.regcmd[-1]))[2] == 0x1D for t in taps.tasks)
    assert split(int(emit(api.Pool(x, y, "max", (2, 2), (2, 2)), PPU).tasks[0].regcmd[-1]))[2] == 0x60


def test_extents_cover_channels_written_past_the_logical_end():
    # 16 int8 output channels are computed as a 32-kernel group: two surfaces written
    x = api.Feature("x", 0, 16, 8, 8, "int8", api.Quant(0.1, 0))
    y = api.Feature("y", 0, 16, 8, 8, "int8", api.Quant(0.1, 0))
    r = emit(api.Conv2D(x, np.zeros((16, 1, 1, 16), np.int8), y, weight_quant=api.Quant(0.1)))
    assert r.extents()["y"] == 2 * 8 * 8 * 16
    assert register("DPU_DATA_CUBE_CHANNEL").unpack(int(r.tasks[0].regcmd[[d.name for d in decode(
        r.tasks[0].regcmd)].index("DPU_DATA_CUBE_CHANNEL")] >> 16) & 0xFFFFFFFF)["ORIG_CHANNEL"] == 15


def test_tail_is_four_entries_with_the_block_mask():
    r = emit(api.Gemm(api.Feature.gemm("A", 0, 4, 32, "int8"), np.zeros((32, 32), np.int8),
                          api.Feature.gemm("C", 0, 4, 32, "int32"), 4))
    tail = [split(int(e)) for e in r.tasks[0].regcmd[-TAIL_ENTRIES:]]
    assert tail[2] == (0x41, 0, 0) and tail[3] == (0x81, 0x0008, 0x1D)
