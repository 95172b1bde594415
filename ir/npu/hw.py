"""Physical constants of the RK3588 NPU (sources: docs/hardware-facts.md)."""

CORES = 3
CLOCK_HZ_MAX = 1_000_000_000  # 1 GHz with kernel/ applied; stock rocket boots at 200 MHz
MACS_PER_CYCLE = {"int8": 1024, "int16": 512, "fp16": 512, "bf16": 512, "tf32": 256, "int4": 2048}

CBUF_BANKS = 12
CBUF_BANK_BYTES = 32 * 1024
CBUF_ENTRIES_PER_BANK = 256
CBUF_ENTRY_BYTES = 128  # 8 feature atoms of 16 bytes

# C2: channels per 16-byte atom of the native NC1HWC2 feature layout, per element size
ATOM_BYTES = 16

DRAM_BYTES_PER_S_PEAK = 33.8e9  # LPDDR4X-4224 x 64 bit
DRAM_BYTES_PER_S_SUSTAINED = 25e9  # default for the performance model (17-30 GB/s measured)

# per-kick overhead of stock rocket (one kick and one IRQ per task), measured 27-51 us
KICK_OVERHEAD_S = 30e-6
