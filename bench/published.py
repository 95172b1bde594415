"""Published RK3588 measurements rkc can hold its performance model against:
the data table bench/silicon.py (model vs silicon), bench/scale.py and
bench/run.py (anchors) read. Each row: what was measured, on which cores, at
which NPU clock and precision, the figure and its unit, and where it is
published (URL and version). Figures only, in our words; their code stays theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

MODEL_ZOO = ("https://github.com/airockchip/rknn_model_zoo README 'Model performance benchmark (FPS)', "
             "RK3588 @single_core, max NPU frequency (v2.3.2; v2.1.0 printed 453.0 / 109.0 / 46.2)")
ROCKET_USERSPACE = ("https://github.com/gregordinary/rocket-userspace README 'Performance' (RK1 board, "
                    "patches/rocket clock patch: NPU at 600 MHz, resident weights, 3 cores)")
RKLLM = ("https://github.com/airockchip/rknn-llm benchmark.md (v1.3.0 era), RK3588 w8a8, seqlen 128, "
         "64 new tokens, CPU and NPU at max frequency")
TEFLON_DOC = "https://gitlab.freedesktop.org/mesa/mesa docs/teflon.rst 'Tested models', QuartzPro64 (rocket)"
TEFLON_BLOG = ("https://blog.tomeuvizoso.net/2024/03/rockchip-npu-update-2-mobilenetv1-is.html "
               "(2024-03-28, QuartzPro64, vendor rknpu kernel driver, 'same performance as the blob')")


@dataclass(frozen=True)
class Published:
    key: str
    what: str
    workload: str  # bench/silicon.py WORKLOADS key
    precision: str
    cores: int
    clock_hz: float
    value: float
    unit: str  # fps | ms | GOP/s | us | tokens/s
    source: str
    dram_bytes_per_s: float = 25e9  # the board's DRAM bandwidth as the NPU sees it
    clock_note: str = ""  # how the clock is known
    # the measured runtime kicks once per job (a hardware chain) rather than once per task: the vendor's
    # driver chains int8 tasks too (PC_TASK_CONTROL task number; rocket-userspace's notes, shared
    # peers-and-assets.md), stock rocket kicks every task
    chained: bool = False
    low: float | None = None  # a published range: value is its top, low its bottom


STREAMING_17 = 17e9  # RK1 streaming reads ~17 GB/s (gregordinary, via shared hw-matmul.md 4.1)

PUBLISHED: tuple[Published, ...] = (
    Published("vendor_resnet50", "ResNet-50 v2 (rknn, vendor runtime)", "resnet50", "int8", 1, 1e9, 110.1, "fps",
              MODEL_ZOO, clock_note="max NPU frequency (1 GHz, rknn-llm fix_freq_rk3588.sh)", chained=True),
    Published("vendor_mobilenet_v2", "MobileNetV2 (rknn, vendor runtime)", "mobilenet_v2", "int8", 1, 1e9, 450.7,
              "fps", MODEL_ZOO, clock_note="max NPU frequency (1 GHz)", chained=True),
    Published("vendor_ppocr_det", "PP-OCRv4 det 480x480 (rknn, vendor runtime)", "ppocr_det", "int8", 1, 1e9,
              46.2, "fps", MODEL_ZOO.replace("v2.3.2; ", "v2.1.0 figure; "),
              clock_note="max NPU frequency (1 GHz)", chained=True),
    Published("vendor_yolov8n", "YOLOv8n 640x640 (rknn, vendor runtime; post-processing on the CPU, untimed)",
              "yolov8n", "int8", 1, 1e9, 73.5, "fps", MODEL_ZOO, clock_note="max NPU frequency (1 GHz)",
              chained=True),
    Published("vendor_yolo11n", "YOLO11n 640x640 (rknn, vendor runtime; post-processing on the CPU, untimed)",
              "yolo11n", "int8", 1, 1e9, 60.0, "fps", MODEL_ZOO, clock_note="max NPU frequency (1 GHz)",
              chained=True),
    Published("teflon_mobilenet_v1_rocket", "MobileNetV1 (Mesa Teflon on mainline rocket)", "mobilenet_v1", "int8",
              1, 200e6, 18.0, "ms", TEFLON_DOC,
              clock_note="not published; mainline rocket leaves the NPU at its 200 MHz boot clock "
                         "(rocket-userspace README 'Clock')"),
    Published("teflon_mobilenet_v1_rknpu", "MobileNetV1 (Mesa Teflon on the vendor rknpu driver)", "mobilenet_v1",
              "int8", 1, 1e9, 10.8, "ms", TEFLON_BLOG,
              clock_note="not published; the vendor driver's DVFS maximum, 1 GHz, assumed"),
    Published("rocket_gemm_fp16", "GEMM 512x3840x4096 fp16, resident weights", "gemm_fp16", "fp16", 3, 600e6,
              461.0, "GOP/s", ROCKET_USERSPACE, STREAMING_17, "600 MHz (clock patch)"),
    Published("rocket_gemm_int8", "GEMM 512x3840x4096 int8, resident weights", "gemm_int8", "int8", 3, 600e6,
              386.0, "GOP/s", ROCKET_USERSPACE, STREAMING_17, "600 MHz (clock patch)"),
    Published("rocket_submit", "per-submit overhead of stock rocket (IRQ on an A55 .. pinned big core)", "submit",
              "", 1, 600e6, 51.0, "us", ROCKET_USERSPACE + "; shared hw-matmul.md 4.2",
              clock_note="independent of the clock", low=27.0),
    Published("rkllm_qwen25_decode", "Qwen2.5-1.5B decode (RKLLM)", "qwen2.5-1.5b:decode", "int8", 3, 1e9, 16.69,
              "tokens/s", RKLLM, clock_note="max NPU frequency (1 GHz)", chained=True),
    Published("rkllm_qwen25_ttft", "Qwen2.5-1.5B first token at 128 prompt tokens (RKLLM)",
              "qwen2.5-1.5b:prefill_128", "int8", 3, 1e9, 378.31, "ms", RKLLM,
              clock_note="max NPU frequency (1 GHz)", chained=True),
    Published("rkllm_gemma4_e2b_decode", "Gemma 4 E2B decode (RKLLM)", "gemma-4-e2b:decode", "int8", 3, 1e9, 11.12,
              "tokens/s", RKLLM, clock_note="max NPU frequency (1 GHz)", chained=True),
    Published("rkllm_gemma4_e2b_ttft", "Gemma 4 E2B first token at 128 prompt tokens (RKLLM)",
              "gemma-4-e2b:prefill_128", "int8", 3, 1e9, 599.0, "ms", RKLLM,
              clock_note="max NPU frequency (1 GHz)", chained=True),
)
BY_KEY = {p.key: p for p in PUBLISHED}
OTHER_RKLLM = "vendor, other sizes: TinyLlama 1.1B 24.43 t/s, Qwen3-0.6B 32.91 t/s (w8a8 decode)"

# The vendor's RK3588 w8a8 first-token times at 128 prompt tokens (RKLLM benchmark.md, the table of
# rkllm_qwen25_ttft) of its dense transformer decoders, with each model's decoder widths from its published
# Hugging Face config.json (num_hidden_layers, hidden_size, intermediate_size, heads x head_dim for Q and for
# K/V; every one a gated MLP): bench/silicon.py splits first-token time over model size into a fixed part and
# a part proportional to the matrix work. Left out: RWKV7 (no attention), Gemma3n, Qwen3.5, MiniCPM3/4,
# TeleChat2 (per-layer embeddings, linear attention, MLA, or widths not checked), the VL and MoE rows.
# (model, TTFT ms, layers, hidden, intermediate, q width, kv width)
RKLLM_TTFT_128_BY_SIZE: tuple[tuple[str, float, int, int, int, int, int], ...] = (
    ("Qwen2-0.5B", 145.90, 24, 896, 4864, 14 * 64, 2 * 64),
    ("Qwen3-0.6B", 199.09, 28, 1024, 3072, 16 * 128, 8 * 128),
    ("TinyLlama-1.1B", 243.93, 22, 2048, 5632, 32 * 64, 4 * 64),
    ("Qwen2.5-1.5B", 378.31, 28, 1536, 8960, 12 * 128, 2 * 128),
    ("InternLM2-1.8B", 380.14, 24, 2048, 8192, 16 * 128, 8 * 128),
    ("Gemma2-2B", 598.41, 26, 2304, 9216, 8 * 256, 4 * 256),
    ("Phi3-3.8B", 1017.28, 32, 3072, 8192, 32 * 96, 32 * 96),
    ("ChatGLM3-6B", 1352.94, 28, 4096, 13696, 32 * 128, 2 * 128),
)
