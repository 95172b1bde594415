"""rkc: an ahead-of-time compiler and runtime for the Rockchip RK3588 NPU.

The code lives in three subpackages, each in its own folder at the repository root
(setup.py maps them): ``rkc.ir`` (the shared language and file format),
``rkc.runtime`` (devices, loader, CPU kernels, LLM loop) and ``rkc.compiler``
(frontends, passes, emitters, the CLIs).
"""
