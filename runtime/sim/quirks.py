"""Every open hardware question the simulator has to answer, in one place.

The public sources (RK3588 TRM ch. 36 as transcribed in allbilly/rk3588
experimental/rk3588_trm.md @ 40fae7b; Mesa's rocket driver @ bminor/mesa-mesa
5b829658; Linux drivers/accel/rocket @ torvalds/linux 0755a4e3;
gregordinary/rockchip-npu-notes @ e0c72133; gregordinary/rocket-userspace @
e0677862; mtx512/rk3588-npu @ 47239478; happyme531/rknpu2_matmul_open) disagree
or are silent on these. For each, `QUESTIONS` records what the sources say and
which reading the simulator takes; `Quirks` holds the switches the blocks
consult. The rule when unsure: take the reading under which the simulator
REJECTS what might fail on a board, so that what passes here is safe there.
A board measurement changes one value below (and the row in
docs/hardware-questions.md, which mirrors this table).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Question:
    id: str
    title: str
    sources: str
    reading: str


QUESTIONS: tuple[Question, ...] = (
    Question(
        "Q1", "int8 tasks chained in one hardware kick",
        "gregordinary (rocket + batched-submit patch): only the first int8/int4 task of a chained "
        "kick is correct, fp16 chains are bit-exact. happyme531 and RKNN (vendor driver) chain int8 "
        "GEMM tasks exactly.",
        "Reject: in a chained kick, a task after the first whose CORE precision is an integer type "
        "raises QuirkRejection (`chained_integer_tasks`). Stock rocket (one kick per task) is unaffected."),
    Question(
        "Q2", "feature maps with fewer than 4 rows (M < 4 GEMV)",
        "gregordinary: H < 4 gives wrong results for every dtype with realistic data; their one-shot "
        "entry points pad M=1 to 4. mtx512 accepts M=1; RKLLM decodes with M=1 (vendor stack).",
        "Reject a convolution whose input has fewer than `min_feature_rows` (4) rows (CNA DMA_HEIGHT)."),
    Question(
        "Q3", "CNA LINE_STRIDE / SURF_STRIDE units and semantics",
        "TRM: 'line_stride: feature width with virtual box', 'surf_stride: feature map actual surface "
        "area', no units. Every working stream fits one model (hw-matmul.md 2.2): 16-byte units; with "
        "group-line fetch on, LINE_STRIDE is the step between groups of 4 lines (4*W when dense) and a "
        "channel surface starts SURF_STRIDE + LINE_STRIDE after the previous one; with group-line off "
        "LINE_STRIDE is the row pitch and the surface step SURF_STRIDE + W. In the 1-channel (ARGB) "
        "mode Mesa's LINE_STRIDE is the row pitch in bytes.",
        "That model, and nothing else: group-line mode requires LINE_STRIDE == 4*DMA_WIDTH (other "
        "values would separate the two readings, so they are rejected); SURF_STRIDE is read as a "
        "28-bit two's complement number (happyme531 programs -3*M). The ARGB mode is modelled for "
        "1 channel (ARGB_IN=8) only."),
    Question(
        "Q4", "DPU write geometry: size_e, SURFACE_ADD, NOTCH",
        "TRM: size_e 'how many 8 channels in a row ... (minus 1)', SURFACE_ADD 'how many surfaces in a "
        "row', notch 'pixels from the end of width to the end of the line'. Working streams: int8 "
        "conv size_e=1 SURF_ADD=2*S, depthwise int8 3/4*S, fp16 out 1/2*S, fp32 out 3/4*S, int32 out "
        "7/8*S (gregordinary size-e-quirk: int32 with the 'natural' 3 leaves surfaces unwritten), "
        "allbilly row-major fp32 output: NOTCH_ADDR_0 = NOTCH_ADDR_1 = row atoms - 1.",
        "The DPU writes a fixed number of channels per pass (`dpu_channels_per_pass`: 16 for int8 "
        "direct, 32 int8 depthwise, 8 for fp16/bf16 direct, 16 fp16 depthwise (rocket-userspace "
        "gen_conv2d_dw_fp16, HW-validated with size_e 3 for fp16 out; its fp32-out depthwise variant "
        "writes size_e 3 with SURFACE_ADD 8*S, which this reading rejects)); size_e must be "
        "pass*out_bytes/8 - 1 in "
        "all three fields and SURFACE_ADD must be DST_SURF_STRIDE*(size_e+1); any other value "
        "raises. Output line pitch = (width + NOTCH_ADDR_0) atoms; NOTCH_ADDR_1 must equal NOTCH_ADDR_0. "
        "int16 convolutions have no writer entry: gregordinary found their output writer emits one "
        "int32 tile or a transposed saturating buffer, never the full result (output-transpose-int16.md)."),
    Question(
        "Q5", "on-NPU int32 element-wise add (EW stage with 32-bit integer operands)",
        "gregordinary: the EW ALU is float-only, int32 adds return garbage (HW-tested). happyme531: a "
        "standalone DPU task does exact int32 split-K reduction on the vendor driver.",
        "Reject an EW ALU/MUL operation on 32-bit operands when the DPU processes integers "
        "(`ew_int32`)."),
    Question(
        "Q6", "per-task limits: large N, large K, FEATURE_GRAINS, the int8 slack bank",
        "13-bit DPU cube fields allow 8191, but a cube at the 8191 ceiling corrupts a tail "
        "(gregordinary LUT QUIRK 3) and N=8192 fp16 poisoned a later job (happyme531, 4096 safe). "
        "happyme531 saw an int8 timeout at K=3840, M>4. TRM: FEATURE_GRAINS 'suggested' "
        "y_stride + kernel_h + 1. gregordinary: an int8 feature tile with W=1 needs one CBUF bank "
        "of slack (last rows garbled at 97-99% fill).",
        "DPU cube width/height/channels <= `max_dpu_cube` (4096); FEATURE_GRAINS >= y_stride + "
        "kernel_h + 1; int8 with DATAIN_WIDTH == 1 needs DATA_BANK >= ceil(bytes/32 KiB) + 1. The "
        "K=3840 report is vendor-driver only and not enforced."),
    Question(
        "Q7", "which hardware field maps to which axis for non-square maps and kernels",
        "Mesa writes TFLite H into DATAIN_WIDTH (self-consistent only for square shapes, README of the "
        "golden captures); gregordinary writes the real width and kept a stride-swap knob for bring-up.",
        "WIDTH is the contiguous axis (atoms of one line, LINE_STRIDE apart), HEIGHT counts lines; "
        "CONV_X_STRIDE, PAD_LEFT and WEIGHT_WIDTH go with width. Under this reading Mesa's non-square "
        "3x3 streams compute a different convolution than their reference (reported, not hidden)."),
    Question(
        "Q8", "CORE 0x3030 and DPU 0x40C4 (unnamed registers)",
        "Not in registers.xml; Mesa and rocket-userspace always write 0.",
        "A task enabling CORE (DPU) must write CORE 0x3030 (DPU 0x40C4) with 0; anything else raises "
        "(`unnamed_zero`)."),
    Question(
        "Q9", "PC_OPERATION_ENABLE bits",
        "TRM: bit 55 of a regcmd entry sets op_en of the blocks in its value; example 0x7f. Working "
        "masks: 0x0D, 0x1D (conv), 0x18 (DPU only), 0x60 (PPU). Bit 1 names no block in registers.xml.",
        "Bits: CNA 0, CORE 2, DPU 3, DPU_RDMA 4, PPU 5, PPU_RDMA 6. Bit 1 raises; CNA and CORE only "
        "together; DPU only with DPU_RDMA (rocket hangs on an unprogrammed DPU-RDMA, mrdma-trap)."),
    Question(
        "Q10", "OUT_CVT rounding",
        "TRM: CVT_ROUND 'rounding type when 0.5' (0: carry if odd, 1: always carry), i.e. round to "
        "nearest. gregordinary out-cvt-converter.md: @ e0c72133 the shift truncates (floor) on the "
        "integer path; @ 224b1390 (HW sweep on RK3588 and RK3576, 128 tie elements per setting) it "
        "rounds to nearest, CVT_ROUND 0 ties to even, 1 ties away from zero.",
        "Round to nearest, ties per the stage's round field (OUT_CVT CVT_ROUND, EW_CVT_ROUND, "
        "CLIP_TRUNCATE and CNA CVT ROUND_TYPE; 0: to even, 1: away from zero, the other fields read "
        "like the measured CVT_ROUND); the EW multiplier's truncation has no field and ties up. The "
        "DPU's OUT_CVT and EW shifts follow `out_cvt_rounding` (\"floor\" makes them floor shifts). "
        "The BS/BN multiplier's shift is Q21. Chosen by replaying Mesa's captures against their "
        "independent references: nearest reproduces 187 exactly and the rest within 1 LSB, a floor "
        "shift only 11 exactly."),
    Question(
        "Q11", "BS/BN ALU algorithms",
        "TRM: 2 = add, 4 = minus, 0/1/3 reserved. NVDLA, whose SDP X1/X2 the BS/BN stages are: 0 max, "
        "1 min, 2 sum, 3 equal (nvdla/hw cmod/hls/sdp/sdp_x.cpp @ 9e5648d0: max/min compare the "
        "operand with the data); hw-matmul.md 5 reads 0 max, 1 min. No RK3588 measurement of 0/1.",
        "Add, minus, max (0) and min (1) with the register or the per-channel operand "
        "(`bs_bn_alu_algos`); 3 and the other values raise. Max and min follow NVDLA, unmeasured on "
        "RK3588."),
    Question(
        "Q12", "tasks without a DPU interrupt; PPU completion",
        "Linux rocket_job.c completes a task only on DPU_0/DPU_1 raw interrupt status; a PPU-only "
        "task (mask 0x60) never completes there. gregordinary runs PPU pools on a patched stack.",
        "Every task must enable the DPU writing to memory (`completion_blocks`)."),
    Question(
        "Q13", "element-wise operand fetch (ERDMA) without a convolution",
        "gregordinary: a flying (DPU-only) EW with an ERDMA operand wrote all zeros; an identity "
        "convolution as main feed works. happyme531 runs standalone int32 adds on the vendor driver.",
        "Reject an ERDMA operand in flying mode (`flying_erdma`)."),
    Question(
        "Q14", "PPU precision",
        "gregordinary: PPU int8 pooling reads the bytes as fp16 (garbage); fp16 is bit-exact.",
        "PPU/PPU_RDMA must process fp16 (`ppu_precisions`)."),
    Question(
        "Q15", "atrous (dilated) convolution encoding",
        "TRM: 'pad numbers inserted ... between 2 pixels'; rocket-userspace writes rate-1 and calls it "
        "a guess; Mesa rejects dilation.",
        "Non-zero ATROUS_X/Y_DILATION raises."),
    Question(
        "Q16", "elementwise operand surface stride floor",
        "Mesa and gregordinary program EW_SURF_STRIDE = max(W*H, 12) surfaces; gregordinary: below "
        "12 the upper channel surfaces mis-stride on hardware.",
        "With the combined MRDMA/ERDMA read (COMB_USE=5) EW_SURF_STRIDE must equal the operand surface "
        "(W*H atoms of the whole cube), so W*H < 12 raises."),
    Question(
        "Q17", "CPEND (BS_OW_OP x input window sum) and CORE CLIP_TRUNCATE",
        "Mesa subtracts the input zero-point term from the bias divided by 2^t but lets the OW_OP term "
        "through CPEND; its captures with truncation all have OW_OP = 0. rocket-userspace's "
        "HW-validated fp16 depthwise writes OW_OP=0x80 with OD_BYPASS=0. gregordinary "
        "out-cvt-converter.md @ 224b1390 (HW): with OW_SRC=1 the CPEND operand is per channel, the "
        "int16 B of the BS operand groups (Q21), window sum including the border padding; with OW_SRC=0 "
        "B is not read.",
        "CPEND adds OW x (sum of the input window, all DATAIN_CHANNEL channels, padding included) on "
        "integer datapaths and needs QD_EN=1; OW is OW_OP, or with OW_SRC=1 the per-channel B of the "
        "BRDMA groups (other DATA_USE values then starve it: raises); it is inert on float datapaths; a "
        "non-zero OW with CLIP_TRUNCATE != 0 raises."),
    Question(
        "Q18", "the LUT and the EW stage around it",
        "gregordinary dpu-lut-activation.md (HW): BN maps x to an index, 513-entry LE/LO tables with "
        "index select 5 over [-16384, 0] / [0, 16384], hybrid mux on the sign, slopes outside; an entry "
        "of 0 decodes as ~4.0; its EW word leaves the EW op on with a zero register operand. "
        "act_lut_readme.md: entries are signed int16.",
        "Exactly that configuration, on a float datapath, with both tables uploaded in the same task: "
        "signed 16-bit entries, linear interpolation, result rounded to an integer; the EW op with a "
        "zero register operand is inert; other LUT_CFG values, geometries, a zero entry, an ERDMA "
        "operand next to the LUT raise. The x~0 and flat-run glitches are not modelled."),
    Question(
        "Q19", "how many channels the DPU writes",
        "TRM: DATA_CUBE_CHANNEL.CHANNEL is the cube, ORIG_CHANNEL the 'original output channel', "
        "OFFSET_PEND 'what value the extra channel be set'. Mesa programs CHANNEL = 32 for 16 real "
        "channels (64 for depthwise <= 32) and allocates output BOs twice the data size.",
        "The WDMA writes CHANNEL+1 channels rounded up to whole passes; channels past ORIG_CHANNEL hold "
        "OFFSET_PEND. Buffers must hold all of them (Mesa's depthwise streams with <= 16 channels write "
        "past their output BO under this reading)."),
    Question(
        "Q20", "fp16/bf16 accumulation order",
        "hw-matmul.md 1: the accumulator keeps fp16 sums in an FP32-class precision; the order is not "
        "documented. rocket-userspace's fp32-out gate passes at a normalised error below 2e-4.",
        "Products are exact in fp32 and summed in fp32 by sgemm, whose order is one valid fp32 order; "
        "results differ from the hardware's by fp32 rounding only (bounded by K * 2^-23 * sum|a*b|). "
        "Tests compare fp16 paths against that bound, never bit for bit."),
    Question(
        "Q21", "BS/BN operands from memory (DATA_USE) and the BS multiplier",
        "gregordinary out-cvt-converter.md and sdp-stage-precision.md @ 224b1390 (HW sweep, RK1, "
        "int8-out depthwise program; the direct program computes the same model): BRDMA_DATA_USE 1 "
        "reads a dense int32 bias; 7 reads one 64-byte group per 8 output channels: int32 A[8] at 0, "
        "int16 B[8] at 32, int16 C[8] at 48; with BS_CFG 0x20140 (ALU add of A from DMA, MUL live) and "
        "BS_MUL_SRC the stage computes sat32(rne(((acc + A) * C) >> (p >= 0 ? s : s_neg))), p the "
        "product held wide, s = BS_MUL_SHIFT_VALUE, s_neg = DATA_FORMAT BS_MUL_SHIFT_VALUE_NEG, ties to "
        "even (9216/9216 elements; half-up 9174). BN with NRDMA_DATA_USE 7, BN_MUL_SRC and the ALU "
        "from DMA hung every task (8 of 8); other BN layouts unsearched. No source shows a dense int16 "
        "MUL operand (DATA_USE 4).",
        "DATA_USE 7 on BS is that group layout and that arithmetic, on integer datapaths, and only "
        "with the ALU and the MUL both reading it (`grouped_operand_stages`); on BN it raises HangError "
        "(the measured hang) or, for other combinations, UnsupportedError. DATA_USE 1 is a dense ALU "
        "vector (int32, fp32 on float datapaths), 4 a dense MUL vector (int16 / fp16, unmeasured); "
        "other values raise. Every integer BS/BN multiply follows the measured rule: wide product, "
        "sign-split shift, round half to even (`bs_bn_mul_rounding`), int32 saturation (BN by "
        "analogy: the same SDP X unit)."),
    Question(
        "Q22", "the LUT on an integer datapath",
        "None: every validated LUT program (dpu-lut-activation.md, act_lut_readme.md) runs on fp16 data, "
        "the BN index multiply taking an fp16 operand and OUT_CVT decoding the Q0.15 entry to fp16. "
        "Whether an int8 convolution's int32 accumulator can index the table (BN integer multiply and "
        "shift to the index range) and OUT_CVT requantize the entry to int8 in the same task is not "
        "measured. The vendor's int8 YOLO models run SiLU on the NPU, which suggests it can.",
        "Refused: a LUT stage on an integer datapath raises. The compiler runs an int8 program's groups "
        "that need a table (SiLU, sigmoid, GELU, hard-swish) in fp16 instead (`compiler/emitter_ops.py` "
        "`plan_groups`). `rkc probe` lut_int8 asks a board: an int8 1x1 convolution with the sigmoid "
        "table, the index from a BN integer multiply (ALU bypassed, the shift sign-split as BS's), OUT_CVT "
        "requantizing the entry to int8, against the fp16 program of the same function in the same "
        "submit (within one int8 step); here it reports 'refused by the simulator: needs a board'."),
    Question(
        "Q23", "the int4 datapath: nibble order of A, the int16 output's range, the DPU around it",
        "hw-matmul.md 0/2.1/3.2: precision code 6, A as (K/32, M, 32) 'nibble-packed, same scheme with 32', "
        "B as (N/64, K/32, 64, 32) nibbles low nibble first ('HILO=0'), int4 x int4 -> int16 output "
        "written with size_e 7; 2048 MACs per cycle; K % 32, N % 64 (Rockchip matmul header). Silent on: "
        "the nibble order of A, the accumulator's width and whether an int16 result beyond +-32767 "
        "saturates, wraps or is cut from a wider sum by OUT_CVT, the DPU precision fields and BS/BN/EW "
        "stages on this datapath, and single-row (M = 1) maps (Q2 for every dtype).",
        "A's atoms hold the even channel in the low nibble, as B's tiles do; CNA, CORE and DPU "
        "IN/PROC_PRECISION are all 6 and OUT_PRECISION is int16 (1), written 32 channels per pass "
        "(size_e 7, SURFACE_ADD 8 x stride); only 1x1 stride-1 direct convolutions over whole 64-kernel "
        "tiles run; the BS, BN and EW stages must be bypassed and OUT_CVT must be the identity "
        "(scale 1, shift 0, offset 0); a result outside int16 raises QuirkRejection "
        "(`int4_int16_overflow`: the emitter bounds K per task so that none can occur). `rkc probe` "
        "(int4 checks) settles the nibble order, the overflow behaviour and M = 1 on a board."),
    Question(
        "Q24", "nearest upsampling (Resize) on the NPU",
        "TRM: CNA_CONV_CON1 DECONV and CNA_CONV_CON3 DECONV_X/Y_STRIDE are named without semantics, and "
        "no Mesa, rocket-userspace or gregordinary stream sets them (Q15). The DPU write has no pixel "
        "stride (Q4: a line is width + NOTCH_ADDR atoms), so a write can repeat rows (two tasks, the "
        "destination one line apart, the line pitch doubled by the notch) but not columns; the PPU reads "
        "and writes dense cubes (ppu-pooling.md). No source upsamples on this NPU outside the vendor "
        "stack, whose encoding is not public.",
        "Refused: DECONV and the deconvolution strides raise (runtime/sim/cna.py). Without them, a nearest "
        "Resize by an integer factor k is convolutions of ones (compiler/npu/upsample.py): k 1x1 copies "
        "whose destination line pitch is k lines (the notch, Q4) repeat the rows, and a 1xk window padded "
        "by k-1 columns each side over that map read as one-pixel rows repeats the columns; other resizes run on "
        "the CPU on the feature maps in place (runtime/map_ops.py). `rkc probe` "
        "deconv_x2 asks a board: a depthwise fp16 deconvolution (DECONV, DECONV_X/Y_STRIDE 2, a 2x2 "
        "kernel of ones, PAD 1, the CNA reading the HxW map) written as a 2x2 convolution over the "
        "zero-stuffed (2H-1)x(2W-1) map, against numpy's nearest x2; here it reports 'refused by the "
        "simulator: needs a board'."),
    Question(
        "Q25", "the BS/BN multiplier in PReLU mode (MUL_PRELU)",
        "hw-matmul.md lists PReLU among the BS (X1) stage's functions beside ALU, MUL and ReLU/ReLUX; the "
        "field MUL_PRELU sits in BS/BN_MUL_CFG as in NVDLA's SDP X1/X2 stages, whose documentation defines it "
        "as the multiplier applied to negative inputs only. No Mesa, rocket-userspace or gregordinary stream "
        "sets it, so neither the fp16 operand's use nor the integer path's shift and rounding on negative "
        "values is measured on RK3588.",
        "`MUL_PRELU` multiplies values below zero and passes the rest (runtime/sim/dpu_x.py), with Q21's "
        "integer rule (wide product, sign-split shift, ties to even) on integer datapaths. The compiler folds "
        "LeakyRelu after a Conv/Gemm into BN in this mode (compiler/npu/epilogue.py); no model in bench uses "
        "LeakyRelu. `rkc probe` prelu runs an fp16 and an int8 program against the simulator's result; a "
        "board that disagrees makes LeakyRelu epilogues wrong, and the fold must then be turned off."),    Question(
        "Q26", "the CNA's packed-image input (ARGB_IN) beyond one channel",
        "hw-rocket-and-mesa.md 4.1-4.2: Mesa programs the CNA's input converter only for a 1-channel input "
        "(CONV_CON1 NONALIGN_DMA, GROUP_LINE_OFF, ARGB_IN 8; CVT_CON0..5 with scale 16384, offset -128, "
        "truncate 14, CVT_CON5 0xFFFF), the bytes raw and each row padded to 16 bytes; every other input is"
        " NC1HWC2 atoms of 16 bytes, so a 3-channel image is 16 bytes per pixel, 13 of them padding. The "
        "TRM names ARGB_IN, the per-channel CVT scales and offsets and DATA_SIGN without semantics. A "
        "public RK3576 reverse-engineering write-up (vendor captures and a hardware sweep on that SoC, not "
        "the RK3588) reads ARGB_IN as 8 | (channels - 1) for 3- and 4-channel packed images, an int8 first "
        "convolution with its own mode (CONV_MODE 6, the kernel's width folded into the channels, its own "
        "weight layout, width and padding bounds) and an fp16 one without the fold, the CVT bypassed, the "
        "row pitch in 16-byte units. Nothing is measured on the RK3588.",
        "Refused: ARGB_IN other than 8 raises QuirkRejection (runtime/sim/cna.py), the 1-channel mode is "
        "modelled as Mesa drives it. The compiler reads every image as atoms: the host writes the model's "
        "float32 image into 16-byte atoms (runtime/kernels/pixels_jit.py), 3 live lanes of 16 or 8, which "
        "bounds a 640x640 detector's input edge by its 6.5 MB of atoms; a uint8 RGB image (--image-input) "
        "read by a stride-2 convolution goes in as 2x2 blocks of 12 channels instead "
        "(compiler/passes/image_blocks.py: 3.3 MB fp16, 1.6 MB int8). `rkc probe` argb_image asks a "
        "board: the emitter's fp16 3x3 convolution of a 16x8 3-channel image with ARGB_IN 8 | 2, "
        "GROUP_LINE_OFF and NONALIGN_DMA, reading the packed image with its row pitch in bytes in one "
        "program and in 16-byte units in another, each against the normal program on atoms in the same "
        "submit; here it reports 'refused by the simulator: needs a board'."),
    Question(
        "Q27", "fp16 output straight from an int8 GEMM",
        "gregordinary/rockchip-npu-notes encodings/out-cvt-converter.md @ 224b1390 (the int8 datapath's "
        "output table; hw-matmul.md 5, one source): on an int8 matmul OUT_PRECISION 2 (fp16) with the writer "
        "at size_e 3, surface add 2 x stride and an output cube of C2 8 is correct only for small single-tile "
        "shapes: wrong or strided values at 64x128x64, and range-limited to |acc| <= 2048 (the int32 "
        "accumulator must fit fp16). Not shipped; the registers of the failing program, FP32TOFP16_EN "
        "included, are not given. Beside it the same table measures int32 and fp32 out (size_e 7, surface add "
        "8 x stride, C2 4; fp32 a bit-exact cast of the int32 sum) as general, and states that the integer "
        "OUT_CVT rounds (acc * SCALE) >> SHIFT to an integer before any cast, so a fractional dequant scale "
        "cannot fold into it: the result counts whole steps.",
        "Refused: OUT_PRECISION 2 on an integer datapath raises (runtime/sim/dpu.py). Compiles never ask for "
        "it (compiler/npu/epilogue.py: int8 GEMMs write int8, int32 or fp32): an int8 FFN's gate and up "
        "products return int32 to the host, which dequantizes them (docs/llm.md). `rkc probe` int8_fp16_out "
        "asks a board (`EmitOptions.integer_fp16_out`): int8 GEMMs of 2 M x 3 N tiles on one core (M=300 "
        "K=1000 N=160) and of N split over 3 cores (M=64 K=512 N=384) writing fp16 with FP32TOFP16_EN, the "
        "writer at size_e 3 / surface x2, the per-channel dequant scale in the BS multiplier (Q21) and one "
        "OUT_CVT gain to a power-of-two step, below 2048 steps; in the same submit the same products as "
        "int32. The fp16 values must be the epilogue's reading of the board's int32 (the requantized integer "
        "cast to fp16) exactly, and times the step the host's dequantization within half a step + 2^-8 of a "
        "step + 2^-8 of the largest value; here it reports 'refused by the simulator: needs a board'."),
)


def _default_passes() -> dict[tuple[str, int], int]:
    # (conv mode, CORE precision) -> channels per DPU pass (Q4)
    return {("direct", 0): 16, ("depthwise", 0): 32, ("direct", 2): 8, ("direct", 3): 8, ("direct", 6): 32,
            ("depthwise", 2): 16, ("depthwise", 3): 16}


@dataclass(frozen=True)
class Quirks:
    """The readings in force (defaults = the conservative ones documented above)."""

    chained_integer_tasks: str = "reject"  # Q1: "reject" | "allow"
    min_feature_rows: int = 4  # Q2
    dpu_channels_per_pass: dict = field(default_factory=_default_passes)  # Q4
    ew_int32: str = "reject"  # Q5
    max_dpu_cube: int = 4096  # Q6
    int8_width1_slack_bank: bool = True  # Q6
    feature_grains_min: bool = True  # Q6
    unnamed_zero: tuple[str, ...] = ("UNNAMED_0x3030", "UNNAMED_0x40c4")  # Q8
    out_cvt_rounding: str = "nearest"  # Q10: "nearest" (tie per CVT_ROUND) | "floor"
    bs_bn_alu_algos: tuple[int, ...] = (0, 1, 2, 4)  # Q11: max, min, add, minus
    completion_blocks: tuple[str, ...] = ("DPU",)  # Q12
    flying_erdma: str = "reject"  # Q13
    ppu_precisions: tuple[int, ...] = (2,)  # Q14
    grouped_operand_stages: tuple[str, ...] = ("BS",)  # Q21: stages that read DATA_USE=7 groups
    bs_bn_mul_rounding: str = "half_even"  # Q21: "half_even" | "half_up" | "floor"
    int4_int16_overflow: str = "reject"  # Q23: "reject" | "saturate" | "wrap"


DEFAULT = Quirks()
