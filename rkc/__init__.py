"""rkc: an ahead-of-time compiler and runtime for the Rockchip RK3588 NPU.

The code lives in three subpackages, each in its own folder at the repository root
(setup.py maps them): ``rkc.ir`` (the shared language and file format),
``rkc.runtime`` (devices, loader, CPU kernels, LLM loop) and ``rkc.compiler``
(frontends, passes, emitters, the CLIs).

``rkc.load("model.rkbin")`` is the Python API (docs/api.md); importing rkc
itself stays light: the runtime is imported by load().
"""



def __getattr__(name: str):
    if name == "load":  # imported on first use, so that `import rkc` loads nothing heavy
        from rkc.runtime.api import load

        return load
    raise AttributeError(f"module 'rkc' has no attribute {name!r}")
