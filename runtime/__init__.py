"""rkc's runtime: load an .rkbin, run NPU segments on a Device (the rocket
driver or the built-in simulator) and CPU ops in numpy.

    from rkc import runtime
    outputs = runtime.load("model.rkbin").run({"x": x})
"""


def load(path, device="auto", quiet: bool = True):
    """Load an rkbin onto a device ("auto", "sim", "rocket" or a Device); see runtime.loader."""
    from rkc.runtime.loader import load as _load  # deferred: `import rkc` stays free of numpy and the runtime

    return _load(path, device, quiet)
