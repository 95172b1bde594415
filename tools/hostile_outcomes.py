"""Run every crafted hostile input (and a fixed sample of fuzzed ones) through
the CLIs of one rkc installation and tabulate the outcomes per loader, as
docs/robustness.md reports them:

    python tools/hostile_outcomes.py --bin .venv/bin --json after.json
    python tools/hostile_outcomes.py --bin /work/main/.venv/bin --json before.json

Each case runs in its own process (rkrun for an rkbin on the simulator, rkc
compile for ONNX and GGUF) with an address-space limit and a timeout, and is
classified: clear error (exit 1, one "error:" line), internal error (exit 70 or
a traceback), hang (timeout), memory blow-up (MemoryError or the limit hit),
wrong success (exit 0 on an input that must be refused: every crafted case, and
a fuzzed ONNX model onnxruntime refuses), leftover file (a temporary or partial
output left behind), accepted (exit 0 on a fuzzed input nothing shows to be
invalid: a mutation may well keep a file valid). Inputs are made with this
checkout's tests/hostile.py and tests/fuzz.py, so both installations see the
same files.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

OUTCOMES = ("clear error", "internal error", "hang", "memory blow-up", "wrong success", "leftover file",
            "accepted")
TIMEOUT_S = 120
MEMORY_LIMIT = 6 << 30  # address space per case: far above any sane input, far below a blow-up


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def classify(cmd: list[str], folder: Path, output: Path | None) -> str:
    before = set(folder.iterdir())
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        return "hang"
    left = [p for p in set(folder.iterdir()) - before if p.name.startswith(".") or p.suffix == ".tmp"]
    if left or (r.returncode != 0 and output is not None and output.exists()):
        return "leftover file"
    err = r.stderr
    if "MemoryError" in err or "Cannot allocate memory" in err or "std::bad_alloc" in err:
        return "memory blow-up"
    if r.returncode == 0:
        return "wrong success"
    lines = [ln for ln in err.splitlines() if not ln.startswith("rkc: using device")]
    if r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "):
        return "clear error"
    return "internal error"


def rkbin_cases(work: Path):
    import numpy as np

    from hostile import mutated, parts, write_raw
    from onnx_models import example, save
    from rkc.compiler.build import BuildOptions, build

    build(save(example("small_cnn").build_model(), work / "good.onnx"), work / "good.rkbin", BuildOptions())
    np.savez(work / "in.npz", x=np.ones((1, 3, 32, 32), np.float32))
    good = work / "good.rkbin"
    from container import test_hostile_module as mod
    from container import test_hostile_rkbin as acc

    for name, (change, _) in {**acc.CASES, **acc.EXTENT_CASES, **mod.MODULE_CASES}.items():
        yield name, mutated(good, work / "case.rkbin", change)
    module, blobs = parts(good)
    for version in ("x", "1", 1.0, 2, None):
        yield f"version {version!r}", write_raw(work / "case.rkbin", module, blobs, version=version)
    for checksums in ("null", "[]", '{"w": 5}'):
        yield f"checksums {checksums}", write_raw(work / "case.rkbin", module, blobs, checksums=checksums)
    deep = json.dumps(module).replace('"metadata": {', '"metadata": {"d": ' + '{"x": ' * 200_000 + "{}"
                                      + "}" * 200_000 + ", ", 1)
    yield "200,000-deep nesting", write_raw(work / "case.rkbin", module, blobs, module_text=deep)
    yield "two 2 GiB scratch regions", mutated(good, work / "case.rkbin", _two_big_regions)
    yield from _fuzzed_modules(module, blobs, work)


def _fuzzed_modules(module: dict, blobs: dict, work: Path):
    """A fixed sample of 15 mutated module trees (tests/fuzz.py), as rkbins."""
    from fuzz import mutated_json
    from hostile import write_raw

    for i, tree in enumerate(_samples(mutated_json(module), 15)):
        try:
            text = json.dumps(tree)
        except ValueError:
            continue
        yield f"fuzzed module {i}", write_raw(work / "case.rkbin", None, blobs, module_text=text)


def llm_rkbin_cases(work: Path):
    """The crafted LLM rkbins of tests/llm/test_hostile_llm_rkbin.py and fuzzed
    module samples of the tiny llama, each run as `rkrun -p` on the simulator."""
    from hostile import mutated, parts
    from llm import test_hostile_llm_rkbin as hl
    from llm.synth import write_model
    from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf

    good = {}
    for arch in ("gemma3", "llama"):
        good[arch] = work / f"{arch}.rkbin"
        compile_gguf(write_model(work / f"{arch}.gguf", arch), good[arch], LlmCompileOptions("int8", (1, 4, 16)))
    for name, (arch, change, _) in hl.CASES.items():
        yield name, mutated(good[arch], work / "case.rkbin", change)
    yield from _fuzzed_modules(*parts(good["llama"]), work)


def _two_big_regions(m, b):
    m["regions"] += [{"name": f"big{i}", "size": (2 << 30) - (1 << 24), "kind": "scratch", "blob": None}
                     for i in range(2)]


def _samples(strategy, n: int) -> list:
    from hypothesis import HealthCheck, given, settings

    out = []

    @settings(max_examples=n, database=None, derandomize=True, suppress_health_check=list(HealthCheck),
              deadline=None)
    @given(strategy)
    def collect(value):
        out.append(value)

    collect()
    return out[:n]


def ort_accepts(path: Path) -> bool:
    """onnxruntime builds a session for the model and runs it on ones."""
    import numpy as np
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {i.name: np.ones([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
                 for i in sess.get_inputs()}
        sess.run(None, feeds)
        return True
    except Exception:
        return False


def onnx_cases(work: Path):
    import onnx

    from compiler import test_hostile_onnx as hx
    from fuzz import onnx_model

    for name, (make, _) in hx.CASES.items():
        onnx.save(make(), str(work / "case.onnx"))
        yield name, work / "case.onnx"
    model = hx.conv_model()
    onnx.save(model, str(work / "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.bin", size_threshold=0)
    data = (work / "ext.bin").read_bytes()
    (work / "ext.bin").write_bytes(data[:len(data) // 2])
    yield "external data shorter than the tensor", work / "ext.onnx"
    for i, (op, model) in enumerate(_samples(onnx_model(), 15)):
        onnx.save(model, str(work / "case.onnx"))
        valid = ort_accepts(work / "case.onnx")
        yield f"fuzzed {op} {i}{'' if valid else ' (onnxruntime refuses it)'}", work / "case.onnx"


def gguf_cases(work: Path):
    from hostile import gguf_with
    from llm import test_hostile_gguf as hg
    from llm.synth import write_model

    good = write_model(work / "good.gguf", "llama")
    for name, (key, value, _) in hg.CASES.items():
        yield name, gguf_with(good, work / "case.gguf", {key: value})
    import gguf as gguf_lib

    from fuzz import mutated_metadata

    kv = {k: f.contents() for k, f in gguf_lib.GGUFReader(good).fields.items()
          if k.startswith("llama.") or k.startswith("tokenizer.ggml.") and k.endswith("_id")}
    for i, mutated_kv in enumerate(_samples(mutated_metadata(kv), 15)):
        changes = {k: v for k, v in mutated_kv.items() if kv.get(k, object()) != v and not isinstance(v, list)}
        changes.update({k: None for k in kv if k not in mutated_kv})
        if changes:
            yield f"fuzzed metadata {i}", gguf_with(good, work / "case.gguf", changes)
    for name, (shapes, _) in hg.TENSOR_CASES.items():  # tensors of the wrong shape
        yield name, write_model(work / "case.gguf", "llama", tensor_shapes=shapes)
    from fuzz import mutated_tensor_shapes
    from rkc.compiler.frontend.gguf import GgufFile

    gf = GgufFile(good)
    shapes = {n: gf.shape(n) for n in gf.tensors}
    blocks = {n: gguf_lib.GGML_QUANT_SIZES[t.tensor_type][0] for n, t in gf.tensors.items()}
    for i, changed in enumerate(_samples(mutated_tensor_shapes(shapes, blocks), 15)):
        if changed:  # every changed shape must be refused: a success is a wrong one
            yield f"tensor shapes {i}", write_model(work / "case.gguf", "llama", tensor_shapes=changed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True, help="bin folder of the rkc installation under test")
    ap.add_argument("--json", help="write the per-case outcomes here")
    ap.add_argument("--table", nargs=2, metavar=("BEFORE", "AFTER"), help="print the table of two --json files")
    ap.add_argument("--loaders", help="only the loaders whose name contains one of these (comma separated)")
    args = ap.parse_args()
    if args.table:
        return print_tables(*(json.loads(Path(f).read_text()) for f in args.table))
    warnings.filterwarnings("ignore")
    bin_dir = Path(args.bin)
    results: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        out_dir = work / "out"
        out_dir.mkdir()
        loaders = {
            "rkbin (rkrun)": (rkbin_cases, lambda p: [str(bin_dir / "rkrun"), str(p), "--inputs",
                                                      str(work / "in.npz"), "--device", "sim"], None),
            "LLM rkbin (rkrun -p)": (llm_rkbin_cases, lambda p: [str(bin_dir / "rkrun"), str(p), "-p", "Hi", "-n",
                                                                   "2", "--temp", "0", "--device", "sim"], None),
            "ONNX (rkc compile)": (onnx_cases, lambda p: [str(bin_dir / "rkc"), "compile", str(p), "-o",
                                                           str(out_dir / "m.rkbin")], out_dir / "m.rkbin"),
            "GGUF (rkc compile)": (gguf_cases, lambda p: [str(bin_dir / "rkc"), "compile", str(p), "-o",
                                                           str(out_dir / "m.rkbin")], out_dir / "m.rkbin"),
        }
        if args.loaders:
            wanted = args.loaders.split(",")
            loaders = {k: v for k, v in loaders.items() if any(w in k for w in wanted)}
        for loader, (cases, command, output) in loaders.items():
            results[loader] = {}
            for name, path in cases(work):
                if output is not None:
                    output.unlink(missing_ok=True)
                outcome = classify(command(path), out_dir, output)
                if outcome == "wrong success" and name.startswith("fuzzed") and "refuses" not in name:
                    outcome = "accepted"
                results[loader][name] = outcome
                print(f"{loader:20} {results[loader][name]:15} {name}", flush=True)
    print()
    print_tables(results)
    if args.json:
        from rkc.ir.atomic import write_atomic

        write_atomic(args.json, json.dumps(results, indent=1) + "\n")


def print_tables(*runs: dict) -> None:
    """One markdown row per loader and run (before/after when given two)."""
    labels = ("before", "after") if len(runs) == 2 else ("",)
    print("| loader | run | cases | " + " | ".join(OUTCOMES) + " |")
    print("|---|---|---|" + "---|" * len(OUTCOMES))
    for loader in runs[-1]:
        for label, run in zip(labels, runs):
            cases = dict(run.get(loader, {}))
            for name, outcome in cases.items():  # runs made before the fuzz rule existed
                if outcome == "wrong success" and name.startswith("fuzzed") and "refuses" not in name:
                    cases[name] = "accepted"
            counts = Counter(cases.values())
            print(f"| {loader} | {label} | {len(cases)} | " + " | ".join(str(counts.get(o, 0)) for o in OUTCOMES)
                  + " |")


if __name__ == "__main__":
    main()
