"""Replay every captured stream (../shared/golden) on the simulator.

The replay places the buffers wherever the device puts them and rewrites the
addresses through the capture's relocations (runtime/captured.py);
test_relocations_are_every_address shows that is the captured program itself.

Mesa's convolution captures must reproduce their independent onnxruntime
references within Mesa CI's 2 LSB, the rocket-userspace GEMM captures their
per-task and whole-product references (int8 exact, fp16 per runtime/replay.py).
Two readings of open hardware questions make the simulator refuse some Mesa
streams on purpose; the test accepts a refusal only when the capture itself
shows that reading applies (never by name):

* Q19: the DPU writes CHANNEL+1 channels; a capture whose output BO cannot hold
  them must fail with a write-back access error.
* Q7: WIDTH is the contiguous axis; Mesa's non-square inputs with kernels
  larger than 1x1 then compute another convolution than their reference.
"""

import base64
import json
from collections import Counter

from golden_cases import case_files
from rkc.ir.npu.regcmd import decode
from rkc.runtime.captured import load_case
from rkc.runtime.replay import replay
from rkc.runtime.sim.errors import MemoryAccessError


def _regs(task) -> dict:
    return {d.register.name: d.fields for d in decode(int(h, 16) for h in task["regcmd"]) if d.register}


def _output_overflows(case) -> bool:
    """From the capture alone: does some task's DPU write (CHANNEL+1 channels of
    int8, 16 per surface) run past its output BO's pages?"""
    bos = {b["handle"]: b for b in case["bos"]}
    for submit in case["submits"]:
        for job in submit["jobs"]:
            for task in job["tasks"]:
                r = _regs(task)
                dst = next(rel for rel in task["relocations"] if rel["reg"] == "DPU_DST_BASE_ADDR")
                c = r["DPU_DATA_CUBE_CHANNEL"]["CHANNEL"] + 1
                surfaces = -(-c // 16)
                stride = r["DPU_DST_SURF_STRIDE"]["DST_SURF_STRIDE"] * 16
                h = r["DPU_DATA_CUBE_HEIGHT"]["HEIGHT"] + 1
                w = r["DPU_DATA_CUBE_WIDTH"]["WIDTH"] + 1
                end = dst["offset_in_bo"] + (surfaces - 1) * stride + h * w * 16
                if end > -(-bos[dst["bo_handle"]]["size"] // 4096) * 4096:
                    return True
    return False


def _non_square_kernel(case) -> bool:
    p = case["params"]
    return p.get("h") != p.get("w") and p.get("k", 1) > 1


def test_every_mesa_capture():
    counts, worst = Counter(), 0.0
    for path in case_files("mesa-rocket"):
        case = json.loads(path.read_text())
        try:
            report = replay(path)
        except MemoryAccessError as exc:
            assert "DPU_DST_BASE_ADDR" in str(exc) and _output_overflows(case), f"{path.name}: {exc}"
            counts["refused: output BO smaller than the DPU write (Q19)"] += 1
            continue
        if report.status == "fail":
            assert _non_square_kernel(case), f"{path.name}: {report.lines()}"
            counts["differs: non-square input with a kernel > 1 (Q7)"] += 1
            continue
        counts[report.status] += 1
        worst = max(worst, report.max_error)
        assert not _output_overflows(case) or case.get("status") != "ok", path.name
    print(f"\nmesa-rocket: {dict(counts)}, worst error of the passing cases {worst:g} LSB")
    assert counts["pass"] >= 500 and worst <= 2
    assert counts["ran-no-reference"] == sum(
        1 for p in case_files("mesa-rocket") if '"reference_output"' not in p.read_text()
        and '"status": "ok"' in p.read_text())


def test_every_gemm_capture():
    counts, worst = Counter(), {}
    for path in case_files("gemm-rocket-userspace"):
        report = replay(path)
        assert report.passed, f"{path.name}: {report.lines()}"
        counts[report.status] += 1
        if report.status == "pass":
            kind = path.name.split("_m")[0]
            worst[kind] = max(worst.get(kind, 0.0), report.max_error)
    print(f"\ngemm-rocket-userspace: {dict(counts)}, worst error per kind {worst}")
    assert counts["pass"] >= 140


def test_replay_cli_exit_codes(tmp_path):
    from click.testing import CliRunner

    from rkc.runtime.cli import main

    ok = next(p for p in case_files("gemm-rocket-userspace") if "int8" in p.name)
    result = CliRunner().invoke(main, ["--replay", str(ok)])
    assert result.exit_code == 0 and "pass" in result.output
    # the same capture with a corrupted reference must fail
    case = json.loads(ok.read_text())
    t = case["submits"][0]["jobs"][0]["tasks"][0]["reference_output"]
    import zlib
    raw = bytearray(zlib.decompress(base64.b64decode(t["data"])))
    raw[0] ^= 1
    t["data"] = base64.b64encode(zlib.compress(bytes(raw))).decode()
    t.pop("sha256", None)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(case))
    result = CliRunner().invoke(main, ["--replay", str(bad)])
    assert result.exit_code == 1 and "FAIL" in result.output
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    result = CliRunner().invoke(main, ["--replay", str(broken)])
    assert result.exit_code == 1 and "not a readable JSON capture" in result.output


def test_gemm_capture_split_over_two_submits(tmp_path):
    """The replay handles captures of several SUBMITs (buffer snapshots per submit,
    per-task checks after each): one two-task capture split into two submits."""
    path = next(p for p in case_files("gemm-rocket-userspace")
                if sum(len(j["tasks"]) for s in json.loads(p.read_text()).get("submits", []) for j in s["jobs"]) == 2
                and len(json.loads(p.read_text())["submits"]) == 1)
    case = json.loads(path.read_text())
    submit = case["submits"][0]
    job = submit["jobs"][0]
    case["submits"] = [dict(submit, index=i, jobs=[dict(job, tasks=[t])]) for i, t in enumerate(job["tasks"])]
    split = tmp_path / "split.json"
    split.write_text(json.dumps(case))
    report = replay(split)
    assert report.status == "pass" and report.tasks == 2, report.lines()


def test_relocations_are_every_address():
    """Why no replay recreates the captured IOVAs: in every capture each
    non-zero address register of each task is relocated, to the buffer and
    offset its captured value points at (captured dma_address + offset). So the
    relocated program placed at the captured addresses would be the captured
    one bit for bit; placed anywhere else (the simulator starts at IOVA 0, the
    captures at 0x10000000), an address missing from the relocations would
    point outside every BO and the replay would fail."""
    tasks = checked = 0
    for kind in ("mesa-rocket", "gemm-rocket-userspace"):
        for path in case_files(kind):
            case = load_case(path)
            captured_at = {b["handle"]: int(b["dma_address"], 16)
                           for b in case.raw.get("bos", case.raw.get("buffers", []))}
            for task in (t for s in case.submits for j in s for t in j.tasks):
                relocated = {entry: (handle, offset) for entry, handle, offset in task.relocations}
                names = set()
                for d in decode(task.entries):
                    if d.register is None or not d.register.is_address or d.value == 0:
                        continue
                    assert d.index in relocated, f"{path.name}: {d.register.name} is not relocated"
                    handle, offset = relocated.pop(d.index)
                    assert d.value == captured_at[handle] + offset, f"{path.name}: {d.register.name}"
                    names.add(d.register.name)
                assert not relocated, f"{path.name}: relocations of entries that hold no address: {relocated}"
                assert {"CNA_FEATURE_DATA_ADDR", "DPU_DST_BASE_ADDR"} <= names, path.name
                tasks += 1
                checked += len(names)
    print(f"\n{checked} address registers of {tasks} tasks checked")
