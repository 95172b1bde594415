"""The RK3588 NPU machine description: blocks, registers, bit fields, the 64-bit
regcmd entry codec and a disassembler. Facts come from Mesa's registers.xml and the
rocket driver; see docs/hardware-facts.md for sources."""
