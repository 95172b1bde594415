"""A blob written out as it is made, never whole in memory.

An LLM's weights region is GBs (Gemma 4 E2B: 2.3 GB of packed NPU weights and
a 2.35 GB per-layer token table). The rkbin's header (the module JSON and the
checksum table) comes before the blobs and is known only once every program is
lowered, so the blobs are spooled to an unnamed temporary file beside the
output while they are made, their sha256 taken as they go, and copied into the
output (in the kernel: copy_file_range) after the header; ir/rkbin.write_rkbin
writes the same bytes it would have written from memory.

The spool is unnamed where the filesystem allows (O_TMPFILE): nothing is left
behind even by a killed compile.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO

import numpy as np

COPY_CHUNK = 1 << 30  # bytes per copy_file_range call


class SpooledBlob:
    """Bytes appended to a temporary file: `size`, `hexdigest()`, `copy_to(f)`."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self._file = tempfile.TemporaryFile(dir=directory)
        self._hash = hashlib.sha256()
        self.size = 0

    def append(self, data: np.ndarray | bytes | memoryview) -> None:
        view = memoryview(data if isinstance(data, (bytes, bytearray, memoryview))
                          else np.ascontiguousarray(data)).cast("B")
        self._file.write(view)
        self._hash.update(view)
        self.size += view.nbytes

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def copy_to(self, out: BinaryIO) -> None:
        """Append every spooled byte to `out` at its current position."""
        self._file.flush()
        out.flush()
        src, dst = self._file.fileno(), out.fileno()
        done = 0
        try:
            while done < self.size:
                n = os.copy_file_range(src, dst, min(COPY_CHUNK, self.size - done), done)
                if n == 0:
                    raise OSError(f"spool ended after {done} of {self.size} bytes")
                done += n
        except OSError:
            if done:  # copied part of it: a short file would be wrong, not slow
                raise
            self._file.seek(0)
            shutil.copyfileobj(self._file, out)
        else:
            out.seek(0, os.SEEK_END)

    def close(self) -> None:
        self._file.close()
