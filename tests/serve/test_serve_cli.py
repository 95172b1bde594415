"""`rkrun serve` as a user starts it: a process that says where it listens,
answers, and stops on SIGINT; bad arguments are one line and exit 1."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from serve.conftest import get_json

RKRUN = Path(sys.executable).parent / "rkrun"


def test_rkrun_serve_listens_on_loopback_and_stops(tiny_chat_rkbin):
    p = subprocess.Popen([str(RKRUN), "serve", str(tiny_chat_rkbin), "--port", "0", "--device", "sim"],
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stderr.readline()  # at once: the socket answers while the model loads
        assert line.startswith("rkrun serve: tiny-chat on http://127.0.0.1:") and "loading" in line, line
        url = line.split(" on ")[1].split("/ ")[0]
        ready = p.stderr.readline()
        assert ready.startswith("rkrun serve: tiny-chat ready ("), ready
        assert "chat template gguf" in ready
        assert get_json(url, "/health")["status"] == "ok"
        assert get_json(url, "/v1/models")["data"][0]["id"] == "tiny-chat"
    finally:
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=30) == 0
        p.stderr.close()


def test_rkrun_serve_errors_are_one_line(tiny_chat_rkbin, tmp_path):
    from onnx_models import example, save
    from rkc.compiler.build import BuildOptions, build

    onnx = save(example("mlp").build_model(), tmp_path / "mlp.onnx")
    build(onnx, tmp_path / "mlp.rkbin", BuildOptions())
    cases = [(["--host", "localhost"], "not an IP address"), (["--host", "192.0.2.1"], "cannot listen on"),
             ([str(tmp_path / "mlp.rkbin")], "not an LLM rkbin")]
    for args, message in cases:
        model = [] if args[0].endswith(".rkbin") else [str(tiny_chat_rkbin)]
        r = subprocess.run([str(RKRUN), "serve", *model, *args, "--port", "0"], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 1 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_rkrun_serve_load_failure_is_one_line(tiny_chat_rkbin):
    """The model loads after the socket opens: a failure then still ends the process with one error line."""
    r = subprocess.run([str(RKRUN), "serve", str(tiny_chat_rkbin), "--port", "0", "--ctx", "100000",
                        "--device", "null"], capture_output=True, text=True, timeout=120)
    lines = r.stderr.splitlines()
    assert r.returncode == 1 and len(lines) == 2 and lines[0].startswith("rkrun serve: tiny-chat on"), r.stderr
    assert "exceeds the model's context length" in lines[1] and "Traceback" not in r.stderr
