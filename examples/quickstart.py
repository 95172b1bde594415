"""Quickstart: the main job end to end on a tiny model, with the built-in simulator.

Run it from the repository root after installing rkc:

    python examples/quickstart.py

What it does grows with rkc; today it writes a tiny IR graph and a one-task
regcmd program into out/, then prints them back with `rkc ir` and `rkc disasm`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ir.npu.regcmd import RegcmdBuilder
from ir.npu.registers import Block

OUT = Path("out")

GRAPH = """\
graph "tiny" {
  input %x: fp32[1,16,8,8]
  const %w: fp32[16,16,1,1] = @w
  %y: fp32[1,16,8,8] = Conv(%x, %w, _) {kernel_shape=[1, 1], strides=[1, 1]}
  %z: fp32[1,16,8,8] = Relu(%y)
  output %z
}
"""


def one_task() -> RegcmdBuilder:
    """A hand-written DPU-only program: the tail and the block-enable word."""
    b = RegcmdBuilder()
    b.write("DPU_S_POINTER", POINTER_PP_EN=1, EXECUTER_PP_EN=1, POINTER_PP_MODE=1)
    b.write("DPU_DATA_CUBE_WIDTH", WIDTH=7)
    b.write("DPU_DATA_CUBE_HEIGHT", HEIGHT=7)
    b.address("DPU_DST_BASE_ADDR", "output")
    b.finish([Block.DPU, Block.DPU_RDMA])
    return b


def main() -> None:
    OUT.mkdir(exist_ok=True)
    (OUT / "tiny.ir").write_text(GRAPH)
    (OUT / "task.regcmd").write_bytes(one_task().array().astype("<u8").tobytes())
    for cmd in (["rkc", "ir", str(OUT / "tiny.ir")], ["rkc", "disasm", str(OUT / "task.regcmd")]):
        print("$", " ".join(cmd), flush=True)
        subprocess.run([Path(sys.executable).parent / cmd[0], *cmd[1:]], check=True)


if __name__ == "__main__":
    main()
