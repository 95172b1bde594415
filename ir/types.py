"""Element types, tensor types and quantization parameters of the graph IR."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Union

import numpy as np

from rkc.ir.errors import VerifyError


class DType(str, Enum):
    INT8 = "int8"
    UINT8 = "uint8"
    INT16 = "int16"
    UINT16 = "uint16"
    INT32 = "int32"
    INT64 = "int64"
    FP16 = "fp16"
    BF16 = "bf16"
    FP32 = "fp32"
    FP64 = "fp64"
    BOOL = "bool"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype holding this type; bf16 is held as its raw uint16 bits."""
        return np.dtype(_NUMPY[self])

    @property
    def is_float(self) -> bool:
        return self in (DType.FP16, DType.BF16, DType.FP32, DType.FP64)

    @classmethod
    def from_numpy(cls, dtype: np.dtype | type) -> "DType":
        name = np.dtype(dtype).name
        for member, np_name in _NUMPY.items():
            if np_name == name and member is not DType.BF16:
                return member
        raise ValueError(f"no IR dtype for numpy {name}")


_NUMPY = {
    DType.INT8: "int8", DType.UINT8: "uint8", DType.INT16: "int16", DType.UINT16: "uint16",
    DType.INT32: "int32", DType.INT64: "int64", DType.FP16: "float16", DType.BF16: "uint16",
    DType.FP32: "float32", DType.FP64: "float64", DType.BOOL: "bool",
}
_ITEMSIZE = {d: np.dtype(n).itemsize for d, n in _NUMPY.items()}

# The largest tensor rkc compiles: half the NPU's 4 GiB address window. It
# bounds shapes before anything is allocated (ONNX shapes, constant folding,
# GGUF tensors), so a hostile shape is refused with its size, not a MemoryError.
MAX_TENSOR_BYTES = 1 << 31


def check_tensor_size(shape, itemsize: int, what: str) -> None:
    """Raise VerifyError if a tensor of `shape` (static dims) exceeds MAX_TENSOR_BYTES."""
    n = itemsize
    for d in shape:
        if isinstance(d, int):
            n *= max(d, 0)
    if n > MAX_TENSOR_BYTES:
        raise VerifyError(f"{what}: shape {list(shape)} is {n} bytes, more than the {MAX_TENSOR_BYTES >> 30} GiB "
                          "a tensor may take")


Dim = Union[int, str]  # a fixed size, or a symbolic name for a dynamic dimension


@dataclass(frozen=True)
class PerTensorQuant:
    """real = scale * (q - zero_point) for every element."""

    scale: float
    zero_point: int = 0


@dataclass(frozen=True)
class PerAxisQuant:
    """One scale/zero point per index along `axis`; the vectors are graph
    payloads referenced by name (they can be thousands long)."""

    axis: int
    scale: str
    zero_point: str


@dataclass(frozen=True)
class BlockQuant:
    """Weights stored in a GGUF block format (Q4_K, Q8_0, ...): the payload is
    the raw blocks; the tensor's dtype is the type it dequantizes to."""

    ggml_type: str


Quant = Union[PerTensorQuant, PerAxisQuant, BlockQuant]


@dataclass(frozen=True)
class TensorType:
    dtype: DType
    shape: tuple[Dim, ...]
    quant: Quant | None = None

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def numel(self) -> int:
        if not self.is_static:
            raise ValueError(f"shape {self.shape} has dynamic dimensions")
        return int(np.prod(self.shape, dtype=np.int64))

    def __str__(self) -> str:
        from rkc.ir.text import format_type  # here: rkc.ir.text imports this module

        return format_type(self)
