"""Every compiled host kernel states its float arithmetic.

numba compiles a kernel that does not set `fastmath` with the flags of the
first caller that needs it, and every later call, from Python too, reuses that
compilation (numba issue #7168). A kernel held to numpy's bits (runtime/llm/jit.py)
first reached from a fastmath kernel (decode_attention, the prefill tiles)
would then round differently, depending only on which ran first: at stop 53,
32 bit-identity tests failed in CI's order and passed alone.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
import textwrap

from numba.core.registry import CPUDispatcher

import rkc.runtime


def _kernels():
    """(module:name, dispatcher) of every numba kernel defined in rkc.runtime."""
    for info in pkgutil.walk_packages(rkc.runtime.__path__, "rkc.runtime."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, CPUDispatcher) and value.py_func.__module__ == info.name:
                yield f"{info.name}:{name}", value


def test_every_kernel_states_fastmath():
    kernels = dict(_kernels())
    assert len(kernels) > 100  # the walk found the kernels (runtime/llm, runtime/kernels, half)
    # an inline="always" kernel is compiled into its caller's IR, under the caller's flags by design
    unstated = sorted(name for name, d in kernels.items()
                      if "fastmath" not in d.targetoptions and d.targetoptions.get("inline") != "always")
    assert unstated == []


_FAST_CALLER_FIRST = """
import numpy as np
from numba import njit
from rkc.runtime.llm import jit, kernels

@njit(fastmath={"reassoc", "contract", "nsz", "arcp"})
def fast_caller(x, w, eps, out):
    jit.rms_norm(x, w, eps, out)

rng = np.random.default_rng(7)
x = rng.standard_normal((8, 640)).astype(np.float32)
w = rng.standard_normal(640).astype(np.float32)
eps = np.float32(1e-6)
fast_caller(x, w, eps, np.empty_like(x))
got = np.empty_like(x)
jit.rms_norm(x, w, eps, got)
want = kernels.rms_norm([x, w], {"epsilon": 1e-6}, None)[0]
print("differing", int(np.count_nonzero(got != want)))
"""


def test_a_fastmath_caller_compiled_first_leaves_the_kernel_exact(tmp_path):
    # a fresh numba cache: the fast caller compiles jit.rms_norm before anything else does
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(_FAST_CALLER_FIRST)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["differing", "0"]
