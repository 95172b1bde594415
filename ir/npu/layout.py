"""The NPU's native memory layouts, as pure numpy: one place for the emitters
(packing weights at compile time), the simulator (reading what the hardware
reads) and the runtime (converting tensors at segment edges).

Feature maps ("NC1HWC2"): channels are cut into atoms of 16 bytes, C2 channels
each (16 int8, 8 fp16/int16, 4 int32/fp32); memory order is
``[C/C2][H][W][C2]``. A GEMM operand A[M, K] is the feature map C=K, H=M, W=1,
i.e. ``[K/C2][M][C2]``. (hw-rocket-and-mesa.md 4.2, hw-matmul.md 2.1.)

Weights for direct convolution (and GEMM as 1x1 convolution): kernels are
grouped KG at a time (32 int8, 16 fp16), input channels 32 elements at a time
(the last channel group holds what is left, rounded up to the 16-byte atom);
memory order ``[kernel group][channel group][ky][kx][kernel][channel]``. Every
full tile is 1 KiB. Depthwise weights have one kernel and channel groups of 64
bytes (64 int8, 32 fp16).
(Mesa rkt_coefs.c as documented in hw-rocket-and-mesa.md 4.3; the GEMM layouts
(N/32, K/32, 32, 32) int8 and (N/16, K/32, 16, 32) fp16 of hw-matmul.md 2.1 are
the 1x1 case.)
"""

from __future__ import annotations

import numpy as np

ATOM_BYTES = 16
CHANNEL_GROUP = 32  # input channels per weight tile row
DEPTHWISE_GROUP_BYTES = 64  # depthwise channel groups: 64 int8 (Mesa), 32 fp16 (rocket-userspace
# gen_conv2d_dw_fp16, HW-confirmed: "G=64 fails HW ... G=32 -> max_abs=0")


def depthwise_group_for(itemsize: int) -> int:
    return DEPTHWISE_GROUP_BYTES // itemsize


def c2_for(itemsize: int) -> int:
    """Channels per 16-byte atom for elements of `itemsize` bytes."""
    if itemsize not in (1, 2, 4):
        raise ValueError(f"no NPU feature layout for {itemsize}-byte elements")
    return ATOM_BYTES // itemsize


def kernel_group_for(itemsize: int) -> int:
    """Kernels per weight tile: 32 int8, 16 fp16/int16."""
    if itemsize not in (1, 2):
        raise ValueError(f"no NPU weight layout for {itemsize}-byte elements")
    return 32 // itemsize


def align(value: int, to: int) -> int:
    return -(-value // to) * to


# -- feature maps ---------------------------------------------------------------
def feature_bytes(channels: int, height: int, width: int, itemsize: int) -> int:
    c2 = c2_for(itemsize)
    return align(channels, c2) * height * width * itemsize


def pack_feature(x: np.ndarray, pad_value: int | float = 0) -> np.ndarray:
    """[C, H, W] -> [ceil(C/C2), H, W, C2] (C2 from x's itemsize); channels past C
    are filled with `pad_value`."""
    c, h, w = x.shape
    c2 = c2_for(x.dtype.itemsize)
    out = np.full((align(c, c2), h, w), pad_value, dtype=x.dtype)
    out[:c] = x
    return np.ascontiguousarray(out.reshape(-1, c2, h, w).transpose(0, 2, 3, 1))


def unpack_feature(native: np.ndarray, channels: int) -> np.ndarray:
    """[C1, H, W, C2] -> [C, H, W]."""
    c1, h, w, c2 = native.shape
    return np.ascontiguousarray(native.transpose(0, 3, 1, 2).reshape(c1 * c2, h, w)[:channels])


def feature_view(buf: np.ndarray, channels: int, height: int, width: int, dtype: np.dtype,
                 surface_stride: int | None = None, line_stride: int | None = None) -> np.ndarray:
    """View raw bytes as [C1, H, W, C2] with the given byte strides between
    surfaces (channel groups) and lines (rows); dense by default."""
    dtype = np.dtype(dtype)
    c2 = c2_for(dtype.itemsize)
    atom = c2 * dtype.itemsize
    line = width * atom if line_stride is None else line_stride
    surface = height * line if surface_stride is None else surface_stride
    c1 = -(-channels // c2)
    need = (c1 - 1) * surface + (height - 1) * line + width * atom if c1 and height and width else 0
    if need > buf.size:
        raise ValueError(f"feature map needs {need} bytes, buffer has {buf.size}")
    if surface_stride is None and line_stride is None and buf.ndim == 1 and buf.flags.c_contiguous:
        # dense: a reshape (as_strided took ~10 us, paid by every CPU step at a feature map)
        return buf[:c1 * surface].view(dtype).reshape(c1, height, width, c2)
    return np.lib.stride_tricks.as_strided(
        buf.view(dtype), shape=(c1, height, width, c2),
        strides=(surface, line, atom, dtype.itemsize), writeable=buf.flags.writeable)


def pack_gemm_a(a: np.ndarray) -> np.ndarray:
    """A[M, K] -> feature [K/C2, M, 1, C2] (K padded with zeros)."""
    return pack_feature(a.T[:, :, None])


def unpack_gemm_c(native: np.ndarray, n: int) -> np.ndarray:
    """Output feature [N/C2, M, 1, C2] -> C[M, N]."""
    return unpack_feature(native, n)[:, :, 0].T


# -- weights --------------------------------------------------------------------
def weight_bytes(kernels: int, kh: int, kw: int, channels: int, itemsize: int) -> int:
    return kernels * kh * kw * align(channels, c2_for(itemsize)) * itemsize


def pack_weights(w: np.ndarray, pad_value: int | float = 0) -> np.ndarray:
    """Direct-convolution weights [K, KH, KW, C] -> the flat native layout.

    Input channels are padded to the 16-byte atom with `pad_value`; kernels are
    not padded (the caller decides how many kernels the hardware sees)."""
    k, kh, kw, c = w.shape
    item = w.dtype.itemsize
    kg = kernel_group_for(item)
    cp = align(c, c2_for(item))
    padded = np.full((k, kh, kw, cp), pad_value, dtype=w.dtype)
    padded[..., :c] = w
    full = k // kg * kg
    parts = [_pack_kernel_groups(padded[:full], kg)] if full else []
    if k > full:
        parts.append(_pack_kernel_groups(padded[full:], k - full))
    return np.concatenate(parts) if parts else np.zeros(0, w.dtype)


def _pack_kernel_groups(padded: np.ndarray, kg: int) -> np.ndarray:
    """Kernel groups of `kg` kernels: per group the whole 32-channel tiles, then the
    partial last channel tile, each [ky][kx][kernel][channel]."""
    k, kh, kw, cp = padded.shape
    groups = padded.reshape(k // kg, kg, kh, kw, cp)
    whole = cp // CHANNEL_GROUP * CHANNEL_GROUP
    tiles = groups[..., :whole].reshape(k // kg, kg, kh, kw, whole // CHANNEL_GROUP, CHANNEL_GROUP)
    out = [tiles.transpose(0, 4, 2, 3, 1, 5).reshape(k // kg, -1)]
    if cp > whole:
        out.append(groups[..., whole:].transpose(0, 2, 3, 1, 4).reshape(k // kg, -1))
    return np.concatenate(out, axis=1).reshape(-1)


def unpack_weights(flat: np.ndarray, kernels: int, kh: int, kw: int, channels: int,
                   dtype=None) -> np.ndarray:
    """Inverse of pack_weights: flat native layout -> [K, KH, KW, C_atom_aligned],
    as `dtype` (default: flat's), converted in the same pass."""
    item = flat.dtype.itemsize
    kg = kernel_group_for(item)
    cp = align(channels, c2_for(item))
    need = kernels * kh * kw * cp
    if flat.size < need:
        raise ValueError(f"weights need more than the {flat.size} elements given")
    out = np.empty((kernels, kh, kw, cp), dtype or flat.dtype)
    full = kernels // kg * kg
    if full:  # every whole kernel group at once
        _unpack_kernel_groups(flat[:full * kh * kw * cp], out[:full], kg, kh, kw, cp)
    if kernels > full:
        _unpack_kernel_groups(flat[full * kh * kw * cp:need], out[full:], kernels - full, kh, kw, cp)
    return out


def _unpack_kernel_groups(part: np.ndarray, out: np.ndarray, kgs: int, kh: int, kw: int, cp: int) -> None:
    """Kernel groups of `kgs` kernels each: [group][channel group][ky][kx][kernel][channel]
    with channel groups of 32 and a shorter last one."""
    groups = out.shape[0] // kgs
    rows = part.reshape(groups, kgs * kh * kw * cp)
    whole = cp // CHANNEL_GROUP * CHANNEL_GROUP
    if whole:
        a = rows[:, :kgs * kh * kw * whole].reshape(groups, whole // CHANNEL_GROUP, kh, kw, kgs, CHANNEL_GROUP)
        out[:, :, :, :whole] = a.transpose(0, 4, 2, 3, 1, 5).reshape(groups * kgs, kh, kw, whole)
    if cp > whole:
        t = rows[:, kgs * kh * kw * whole:].reshape(groups, kh, kw, kgs, cp - whole)
        out[:, :, :, whole:] = t.transpose(0, 3, 1, 2, 4).reshape(groups * kgs, kh, kw, cp - whole)


def pack_depthwise_weights(w: np.ndarray, pad_value: int | float = 0) -> np.ndarray:
    """Depthwise weights [KH, KW, C] -> flat native layout (channel groups of 64)."""
    kh, kw, c = w.shape
    cp = align(c, c2_for(w.dtype.itemsize))
    padded = np.full((kh, kw, cp), pad_value, dtype=w.dtype)
    padded[..., :c] = w
    group = depthwise_group_for(w.dtype.itemsize)
    parts = [padded[:, :, c0:c0 + group].reshape(-1) for c0 in range(0, cp, group)]
    return np.concatenate(parts)


def unpack_depthwise_weights(flat: np.ndarray, kh: int, kw: int, channels: int) -> np.ndarray:
    cp = align(channels, c2_for(flat.dtype.itemsize))
    out = np.empty((kh, kw, cp), flat.dtype)
    pos = 0
    group = depthwise_group_for(flat.dtype.itemsize)
    for c0 in range(0, cp, group):
        cgs = min(group, cp - c0)
        n = kh * kw * cgs
        out[:, :, c0:c0 + cgs] = flat[pos:pos + n].reshape(kh, kw, cgs)
        pos += n
    return out


def pack_gemm_b(b: np.ndarray) -> np.ndarray:
    """B[K, N] -> native 1x1 weights: N kernels of K channels."""
    return pack_weights(np.ascontiguousarray(b.T)[:, None, None, :])


# -- int4 (nibble-packed) -------------------------------------------------------
# hw-matmul.md 2.1: an int4 atom holds 32 channels, two per byte; B tiles are
# (N/64, K/32, 64, 32) nibbles, low nibble first ("HILO=0"). rkc reads A's atoms
# the same way (low nibble = the even channel): the documents name no other order
# for A, and docs/hardware-questions.md Q23 asks the board (`rkc probe` int4).
INT4_MIN, INT4_MAX = -8, 7
INT4_C2 = 32  # channels per 16-byte atom
INT4_KERNEL_GROUP = 64  # kernels per 1 KiB weight tile


def pack_nibbles(values: np.ndarray) -> np.ndarray:
    """Signed 4-bit values [..., 2n] (int8 holding -8..7) -> bytes [..., n], the
    even element in the low nibble."""
    v = np.asarray(values)
    if v.shape[-1] % 2:
        raise ValueError("nibble packing needs an even number of elements along the last axis")
    if v.size and (v.min() < INT4_MIN or v.max() > INT4_MAX):
        raise ValueError(f"int4 values must lie in [{INT4_MIN}, {INT4_MAX}]")
    u = v.astype(np.uint8) & 0xF
    return (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(raw: np.ndarray, dtype=np.int8) -> np.ndarray:
    """Bytes [..., n] -> signed 4-bit values [..., 2n] (low nibble first)."""
    raw = np.asarray(raw).view(np.uint8)
    out = np.empty(raw.shape[:-1] + (2 * raw.shape[-1],), np.int8)
    out[..., 0::2] = ((raw & 0xF) ^ 8).astype(np.int8) - 8
    out[..., 1::2] = ((raw >> 4) ^ 8).astype(np.int8) - 8
    return out if dtype is np.int8 else out.astype(dtype)


def pack_feature_int4(x: np.ndarray) -> np.ndarray:
    """[C, H, W] int4 values -> dense feature bytes [C/32, H, W, 16] (channels padded with zeros)."""
    c, h, w = x.shape
    padded = np.zeros((align(c, INT4_C2), h, w), np.int8)
    padded[:c] = x
    atoms = padded.reshape(-1, INT4_C2, h, w).transpose(0, 2, 3, 1)  # [C/32, H, W, 32]
    return np.ascontiguousarray(pack_nibbles(atoms))


def pack_gemm_a_int4(a: np.ndarray) -> np.ndarray:
    """A[M, K] int4 values -> feature bytes [K/32, M, 16] (K padded with zeros)."""
    return pack_feature_int4(a.T[:, :, None])[:, :, 0, :]


def pack_weights_int4(w: np.ndarray) -> np.ndarray:
    """1x1 weights [kernels, C] int4 values (kernels a multiple of 64) -> the flat
    native bytes [kernels/64][C/32][64][16] (C padded to 32 with zeros)."""
    kernels, c = w.shape
    if kernels % INT4_KERNEL_GROUP:
        raise ValueError(f"int4 weights come in whole groups of {INT4_KERNEL_GROUP} kernels, got {kernels}")
    cp = align(c, INT4_C2)
    padded = np.zeros((kernels, cp), np.int8)
    padded[:, :c] = w
    tiles = padded.reshape(kernels // INT4_KERNEL_GROUP, INT4_KERNEL_GROUP, cp // INT4_C2, INT4_C2)
    return np.ascontiguousarray(pack_nibbles(tiles.transpose(0, 2, 1, 3))).reshape(-1)


def unpack_weights_int4(flat: np.ndarray, kernels: int, channels: int, dtype=np.int8) -> np.ndarray:
    """Inverse of pack_weights_int4: flat bytes -> [kernels, channels padded to 32]."""
    cp = align(channels, INT4_C2)
    need = kernels * cp // 2
    flat = np.asarray(flat).view(np.uint8)
    if kernels % INT4_KERNEL_GROUP or flat.size < need:
        raise ValueError(f"int4 weights: {kernels} kernels x {cp} channels need whole 64-kernel groups "
                         f"and {need} bytes")
    tiles = flat[:need].reshape(kernels // INT4_KERNEL_GROUP, cp // INT4_C2, INT4_KERNEL_GROUP, INT4_C2 // 2)
    values = unpack_nibbles(tiles, dtype)  # [G, C/32, 64, 32]
    return np.ascontiguousarray(values.transpose(0, 2, 1, 3)).reshape(kernels, cp)
