"""rkc's shared language: the graph IR and its text form, the NPU machine
description (registers, regcmd codec, disassembler) and the rkbin container.

Nothing in this package imports `compiler` or `runtime`."""
