"""The .rkbin container: a GGUF file (written and read with the `gguf` package)
with ``general.architecture = "rkbin"``.

* ``rkbin.version``: format version (uint32); readers refuse others.
* ``rkbin.module``: the Module (ir.program) as JSON: regions, tensors,
  relocations, programs, metadata.
* ``rkbin.checksums``: JSON {blob name: sha256 hex} over every blob's bytes.
* every blob (weights, regcmd arrays, ...) is a GGUF tensor of raw bytes.

Standard GGUF tools can list the file; GGUF's alignment keeps blobs mmap-able.
Reading checks the magic, version, every checksum and every cross-reference
(Module.validate) before returning, and turns any damage into one FormatError.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from rkc.ir.access import check_accesses
from rkc.ir.atomic import atomic_output
from rkc.ir.errors import FormatError
from rkc.ir.npu.regcmd import ENTRY_BYTES
from rkc.ir.program import Module
from rkc.ir.spool import SpooledBlob

FORMAT_VERSION = 1
ARCH = "rkbin"
KEY_VERSION = "rkbin.version"
KEY_MODULE = "rkbin.module"
KEY_CHECKSUMS = "rkbin.checksums"
MAX_BLOB_NAME = 63  # GGUF tensor names are at most 63 bytes


def _as_bytes(data: np.ndarray | bytes | SpooledBlob) -> np.ndarray | SpooledBlob:
    if isinstance(data, SpooledBlob):  # written out as it was made (ir/spool.py)
        return data
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(data), dtype=np.uint8)
    return np.ascontiguousarray(data).reshape(-1).view(np.uint8)


def _digest(data: np.ndarray | SpooledBlob) -> str:
    if isinstance(data, SpooledBlob):
        return data.hexdigest()
    return hashlib.sha256(memoryview(np.ascontiguousarray(data))).hexdigest()


def write_rkbin(path: str | Path, module: Module, blobs: Mapping[str, np.ndarray | bytes | SpooledBlob]) -> int:
    """Write atomically (temporary file in the same folder, then rename).
    Returns the file size. Validates the module against the blobs first. A
    SpooledBlob (a blob written out as it was made) is copied from its spool:
    the file's bytes are the same as from memory."""
    import gguf  # deferred: a heavy library, which `rkc --help` and `rkrun --help` must not load

    raw = {name: _as_bytes(b) for name, b in blobs.items()}
    for name in raw:
        if not name or len(name.encode()) > MAX_BLOB_NAME:
            raise FormatError(f"blob name {name!r} must be 1..{MAX_BLOB_NAME} bytes")
    module.validate({n: b.size for n, b in raw.items()})
    check_accesses(module, raw)
    path = Path(path)
    with atomic_output(path) as tmp:
        writer = gguf.GGUFWriter(tmp, arch=ARCH)
        writer.add_uint32(KEY_VERSION, FORMAT_VERSION)
        writer.add_string(KEY_MODULE, module.to_json())
        writer.add_string(KEY_CHECKSUMS, json.dumps({n: _digest(b) for n, b in raw.items()}, sort_keys=True))
        write_blobs(writer, raw)
    return path.stat().st_size


def write_blobs(writer, raw: Mapping[str, np.ndarray | SpooledBlob]) -> None:
    """Add every blob (uint8, or spooled) to a GGUFWriter whose key/values are
    set, and write the file: the writer writes the header and tensor infos, the
    blobs follow in order, each at the writer's alignment, as its
    write_tensors_to_file lays them out."""
    import gguf  # deferred: a heavy library (see write_rkbin)

    for name, data in raw.items():
        # GGUF has no u8 type: raw bytes travel as I8 and are viewed back as u8
        writer.add_tensor_info(name, (int(data.size),), np.dtype(np.int8), int(data.size),
                               raw_dtype=gguf.GGMLQuantizationType.I8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    fout = writer.fout[0]
    writer.write_padding(fout, fout.tell())
    for data in raw.values():
        if isinstance(data, SpooledBlob):
            data.copy_to(fout)
        else:
            fout.write(memoryview(np.ascontiguousarray(data)).cast("B"))
        writer.write_padding(fout, int(data.size))
    writer.close()


@dataclass
class Rkbin:
    path: Path
    module: Module
    blobs: dict[str, np.ndarray]  # uint8 views (memory-mapped)

    def regcmd_streams(self) -> list[tuple[str, np.ndarray]]:
        """(title, entries) per task of every NPU step, for the disassembler."""
        streams = []
        regions = {r.name: r for r in self.module.regions}
        for prog in self.module.programs:
            for step in prog.steps:
                for j, job in enumerate(step.jobs):
                    for t, task in enumerate(job.tasks):
                        blob = self.blobs[regions[task.region].blob]
                        entries = blob[task.entry * ENTRY_BYTES:(task.entry + task.count) * ENTRY_BYTES]
                        streams.append((f"{prog.name} / {step.name} / job {j} task {t}",
                                        np.frombuffer(entries.tobytes(), dtype="<u8")))
        return streams


def read_rkbin(path: str | Path) -> Rkbin:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(2, "No such file", str(path))
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise FormatError(f"{path}: not an rkbin file (no GGUF magic)")
    import gguf  # deferred: a heavy library (see write_rkbin)

    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:  # the reader raises many kinds on damage
        raise FormatError(f"{path}: truncated or corrupt rkbin ({type(exc).__name__}: {exc})") from None
    fields = reader.fields

    def text(key: str) -> str:
        if key not in fields:
            raise FormatError(f"{path}: not an rkbin file (missing {key})")
        return str(fields[key].contents())

    if text("general.architecture") != ARCH:
        raise FormatError(f"{path}: a GGUF file of architecture {text('general.architecture')!r}, not an rkbin")
    version = fields.get(KEY_VERSION)
    if version is None or version.types != [gguf.GGUFValueType.UINT32]:
        kind = "missing" if version is None else f"of type {version.types[0].name.lower()}, not uint32"
        raise FormatError(f"{path}: rkbin format version {kind}; this rkc reads version {FORMAT_VERSION}")
    if int(version.contents()) != FORMAT_VERSION:
        raise FormatError(f"{path}: rkbin format version {int(version.contents())}, this rkc reads version "
                          f"{FORMAT_VERSION}")
    try:
        checksums = json.loads(text(KEY_CHECKSUMS))
    except (ValueError, RecursionError):
        raise FormatError(f"{path}: corrupt checksum table") from None
    if not isinstance(checksums, dict) or not all(isinstance(v, str) for v in checksums.values()):
        raise FormatError(f"{path}: the checksum table is not an object of blob name -> sha256 hex")
    blobs = {t.name: np.asarray(t.data).view(np.uint8).reshape(-1) for t in reader.tensors}
    if set(blobs) != set(checksums):
        missing = sorted(set(checksums) ^ set(blobs))
        raise FormatError(f"{path}: blob list and checksum table disagree ({', '.join(missing[:3])})")
    for name, data in blobs.items():
        if _digest(data) != checksums[name]:
            raise FormatError(f"{path}: blob {name!r} fails its checksum (corrupt file)")
    try:
        module = Module.from_json(text(KEY_MODULE))
        module.validate({n: b.size for n, b in blobs.items()})
        check_accesses(module, blobs)
    except FormatError as exc:
        raise FormatError(f"{path}: {exc}") from None
    return Rkbin(path, module, blobs)
