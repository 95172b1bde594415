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

# One core's DMA moves this share of the DRAM bandwidth on its own: memory-bound
# fp16 GQA attention (4K KV decode, vendor driver, NPU 1 GHz, DDR 2112 MHz) took
# 1.79 / 0.94 / 0.76 ms on 1 / 2 / 3 cores (happyme531, summarised in the shared
# hw-matmul.md 4.2): 0.76 / 1.79 = 0.42 for one core, 2 x 0.40 for two, and three
# (3 x 0.42 > 1) saturate DRAM. A single core cannot fill DRAM by itself.
CORE_DMA_SHARE = 0.42
