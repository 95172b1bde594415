"""SIGTERM and SIGHUP while rkc writes an output (rkc compile, rkrun --outputs,
rkc inspect --dot/--svg): no temporary or partial file is left, and an output
that existed before survives unchanged. Real subprocesses, real signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from onnx_models import example, save

BIN = Path(sys.executable).parent

# Runs a CLI in a fresh interpreter; the signal arrives while the output is
# being written: after the writer filled the temporary file, before the rename.
# The signal starts at its default disposition, as a user's shell leaves it: a
# test run under nohup would otherwise pass SIGHUP on ignored, and rkc rightly
# keeps an ignored signal ignored (test_an_ignored_sighup_stays_ignored).
_MID_WRITE = """
import os, signal, sys
signal.signal(signal.{sig}, signal.{disposition})
import rkc.ir.atomic as atomic
real_chmod = atomic.os.chmod
def chmod(path, mode):
    os.kill(os.getpid(), signal.{sig})
    real_chmod(path, mode)
atomic.os.chmod = chmod
sys.argv = {argv!r}
from {module} import main
main()
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("sig")
    onnx_path = save(example("small_cnn").build_model(), d / "m.onnx")
    subprocess.run([str(BIN / "rkc"), "compile", str(onnx_path), "-o", str(d / "m.rkbin")], check=True,
                   capture_output=True)
    np.savez(d / "in.npz", x=np.ones((1, 3, 32, 32), np.float32))
    return d


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or p.name.endswith(".tmp"))


COMMANDS = {
    "compile": ("rkc.compiler.cli", ["rkc", "compile", "{d}/m.onnx", "-o", "{out}"], "out.rkbin"),
    "rkrun --outputs": ("rkc.runtime.cli", ["rkrun", "{d}/m.rkbin", "--inputs", "{d}/in.npz", "--device", "sim",
                                                 "--outputs", "{out}"], "out.npz"),
    "inspect --dot": ("rkc.compiler.cli", ["rkc", "inspect", "{d}/m.rkbin", "--dot", "{out}"], "out.dot"),
    "inspect --svg": ("rkc.compiler.cli", ["rkc", "inspect", "{d}/m.rkbin", "--svg", "{out}"], "out.svg"),
}


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
@pytest.mark.parametrize("command", COMMANDS)
def test_signal_mid_write_leaves_the_old_output(files, tmp_path, command, sig):
    module, argv, name = COMMANDS[command]
    out = tmp_path / name
    out.write_bytes(b"the previous output")
    argv = [a.format(d=files, out=out) for a in argv]
    r = subprocess.run([sys.executable, "-c", _MID_WRITE.format(sig=sig, disposition="SIG_DFL", argv=argv,
                                                                module=module)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 128 + getattr(signal, sig), (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    assert out.read_bytes() == b"the previous output"
    assert _leftovers(tmp_path) == []


def test_an_ignored_sighup_stays_ignored(files, tmp_path):
    """Under nohup (SIGHUP ignored) a hang-up mid-write does not stop rkc: the
    new output is written whole, nothing is left beside it."""
    module, argv, name = COMMANDS["inspect --dot"]
    out = tmp_path / name
    out.write_bytes(b"the previous output")
    argv = [a.format(d=files, out=out) for a in argv]
    r = subprocess.run([sys.executable, "-c", _MID_WRITE.format(sig="SIGHUP", disposition="SIG_IGN", argv=argv,
                                                                module=module)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert out.read_bytes().startswith(b"digraph"), out.read_bytes()[:80]
    assert _leftovers(tmp_path) == []


def test_sigterm_at_any_time_during_a_compile(tmp_path):
    """A compile of a few seconds, terminated at several moments: whenever it
    lands (startup, lowering, writing, after), the folder holds either the old
    output or a complete new one, and nothing else."""
    from llm.synth import write_model
    from rkc.ir.rkbin import read_rkbin

    gguf_path = write_model(tmp_path / "m.gguf", "llama")
    work = tmp_path / "out"
    work.mkdir()
    out = work / "m.rkbin"
    for delay in (0.2, 0.8, 1.5, 2.5, 3.5, 5.0):
        out.write_bytes(b"old")
        p = subprocess.Popen([str(BIN / "rkc"), "compile", str(gguf_path), "-o", str(out)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(delay)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
        assert b"Traceback" not in err, err
        assert _leftovers(work) == [], (delay, _leftovers(work))
        if out.read_bytes() != b"old":  # the rename happened before the signal: a whole, valid file
            read_rkbin(out)
        else:
            assert p.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM), (delay, p.returncode, err)
