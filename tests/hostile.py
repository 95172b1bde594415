"""Crafting hostile rkbins: take a good file apart, change its module JSON (or
blobs), and write it back without the writer's validation, as an attacker or a
broken tool would. Used by the crafted-rkbin tests and the fuzzing harness."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rkc.ir import rkbin as rk


def parts(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(module JSON as plain data, blobs) of a good rkbin."""
    f = rk.read_rkbin(path)
    return json.loads(f.module.to_json()), {n: np.array(b) for n, b in f.blobs.items()}


def write_raw(path: Path, module: Any, blobs: dict[str, np.ndarray], *, version: Any = rk.FORMAT_VERSION,
              checksums: Any = None, module_text: str | None = None) -> Path:
    """Write an rkbin whose fields are whatever the caller says (no validation)."""
    import gguf

    writer = gguf.GGUFWriter(path, arch=rk.ARCH)
    if isinstance(version, int) and not isinstance(version, bool) and 0 <= version < 1 << 32:
        writer.add_uint32(rk.KEY_VERSION, version)
    elif isinstance(version, float):
        writer.add_float32(rk.KEY_VERSION, version)
    elif version is not None:
        writer.add_string(rk.KEY_VERSION, str(version))
    writer.add_string(rk.KEY_MODULE, module_text if module_text is not None else json.dumps(module))
    if checksums is None:
        checksums = {n: rk._digest(rk._as_bytes(b)) for n, b in blobs.items()}
    writer.add_string(rk.KEY_CHECKSUMS, checksums if isinstance(checksums, str) else json.dumps(checksums))
    rk.write_blobs(writer, {n: rk._as_bytes(b) for n, b in blobs.items()})
    return path


def compiled_small_cnn(folder: Path) -> Path:
    """examples/small_cnn.py compiled (fp16) into folder/m.rkbin: the good file crafted cases start from."""
    from onnx_models import example, save
    from rkc.compiler.build import BuildOptions, build

    build(save(example("small_cnn").build_model(), folder / "m.onnx"), folder / "m.rkbin",
          BuildOptions(precision="fp16"))
    return folder / "m.rkbin"


def mutated(good: Path, out: Path, change: Callable[[dict, dict], Any]) -> Path:
    """`change(module, blobs)` edits them in place (or returns a new module)."""
    module, blobs = parts(good)
    result = change(module, blobs)
    return write_raw(out, module if result is None else result, blobs)


def npu_tasks(module: dict):
    """(step, job index, job, task index, task) of every NPU task."""
    for prog in module["programs"]:
        for step in prog["steps"]:
            for j, job in enumerate(step["jobs"]):
                for t, task in enumerate(job["tasks"]):
                    yield step, j, job, t, task


def relocation_of(module: dict, blobs: dict, register: str) -> dict:
    """The first relocation whose entry is `register`."""
    from rkc.ir.npu.regcmd import decode_entry

    regions = {r["name"]: r for r in module["regions"]}
    for rel in module["relocations"]:
        entries = blobs[regions[rel["region"]]["blob"]].view("<u8")
        d = decode_entry(int(entries[rel["entry"]]))
        if getattr(d, "register", None) is not None and d.register.name == register:
            return rel
    raise LookupError(register)


def gguf_with(good: Path, out: Path, overrides: dict[str, Any]) -> Path:
    """A copy of the GGUF `good` whose metadata `overrides` replace (value None:
    the key is removed), each written with the GGUF type its Python type implies."""
    import gguf

    reader = gguf.GGUFReader(good)
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(out, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in overrides:
            continue
        sub = field.types[1] if len(field.types) > 1 else None
        writer.add_key_value(key, field.contents(), field.types[0], sub)
    V = gguf.GGUFValueType
    for key, value in overrides.items():
        if value is None:
            continue
        if isinstance(value, bool):
            writer.add_key_value(key, value, V.BOOL)
        elif isinstance(value, int):
            writer.add_key_value(key, value, V.INT64 if not 0 <= value < 1 << 32 else V.UINT32)
        elif isinstance(value, float):
            writer.add_key_value(key, value, V.FLOAT32)
        else:
            writer.add_key_value(key, str(value), V.STRING)
    for t in reader.tensors:  # quantized data comes as its byte shape, which add_tensor expects
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def assert_refused(good: Path, out: Path, change: Callable[[dict, dict], Any], message: str,
                   load: Callable[[Path], Any]) -> str:
    """`load` of `good` changed by `change` raises one FormatError line matching `message`."""
    import pytest

    from rkc.ir.errors import FormatError

    bad = mutated(good, out, change)
    with pytest.raises(FormatError, match=message) as info:
        load(bad)
    assert "\n" not in str(info.value)
    return str(info.value)
