"""Orthogonal rotations of activation rows before int8 (QuaRot, Ashkboos et al.,
arXiv:2404.00456; SpinQuant, Liu et al., arXiv:2405.16406): x -> x R with R
orthogonal, so a product x W^T equals (x R)(W R)^T exactly, while the rotated
row spreads an outlier channel's energy over all channels and quantizes to
int8 with far less error.

R = D (F (x) H_n) / sqrt(n): D random signs, H_n the Sylvester-Hadamard
matrix of the power of two n (applied by the fast Walsh-Hadamard transform,
O(K log n) per row, vectorised over rows and blocks), F an m x m orthogonal
factor (K = m n):

* "block": F = I — Hadamard on m blocks of n (block-diagonal R);
* "kron":  F a known Hadamard matrix of order m (Paley's constructions) scaled
  to be orthogonal, or a seeded random orthogonal matrix when none is known —
  one transform over the whole row, every entry of R +-1/sqrt(K). Paley's
  orders are multiples of 4, so for K with an odd part m > 1 the factor is
  m 2^j wide (8960 = H140 (x) H64): m 2^j multiply-adds a value;
* "hartley": F the orthonormal Hartley matrix of the odd part m of K
  (cas(2 pi i j / m) / sqrt(m), cas = cos + sin; symmetric, its own inverse)
  and n the whole power-of-two part (8960 = C35 (x) H256): m multiply-adds a
  value, R's entries at most sqrt(2 / K) in magnitude (kron's times sqrt 2);
* "auto" (the compiler's default): kron where its factor is at most
  FLAT_FACTOR_LIMIT wide (the flat R for what it costs little), hartley past it.

`rotate(x, rot)` applies R to rows (activations at a segment edge, and — the
same map — the rows of a weight, W R); `unrotate` applies R^T.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("auto", "kron", "hartley", "block")
# auto: the widest Paley factor kept (multiply-adds a value). Past it (the FFN widths 4864, 6912, 8960,
# 18944) the Hartley factor of the odd part costs 4x fewer; up to it (the residual streams' 640, 1152,
# 1536, 3584) the flat R stays, its product a small share of the rotation's time
# (docs/notes/2026-12-06-rotation-odd-widths.md)
FLAT_FACTOR_LIMIT = 64


@dataclass(frozen=True)
class Rotation:
    signs: np.ndarray  # [K] +-1 (D)
    block: int  # n, a power of two
    factor: np.ndarray | None = None  # [m, m] orthogonal (F), None = identity (block-diagonal)

    @property
    def size(self) -> int:
        return int(self.signs.size)


def _butterflies(a: np.ndarray, b: np.ndarray) -> tuple[list, np.ndarray]:
    """The stages of the transform over the last axis of `a` [rows, n], as
    (src even, src odd, dst even, dst odd) views ping-ponging between a and b.

    Each stage adds and subtracts neighbours (even = sum, odd = difference)
    and writes the sums to the first half of its output, the differences to
    the second (Stockham's self-sorting order): the element pairs, values and
    stage order of the in-place transform that pairs i with i + 1, then 2, 4,
    ..., so the same bits, but every stage runs over rows of n/2 elements
    (the in-place form's first stages iterate over runs of 1, 2, 4 ...)."""
    rows, n = a.shape
    stages, src, dst, h = [], a, b, 1
    while h < n:
        s, d = src.reshape(rows, n // 2, 2), dst.reshape(rows, 2, n // 2)
        stages.append((s[:, :, 0], s[:, :, 1], d[:, 0], d[:, 1]))
        src, dst, h = dst, src, 2 * h
    return stages, src


def _run_butterflies(stages: list) -> None:
    add, sub = np.add, np.subtract
    for s0, s1, d0, d1 in stages:
        add(s0, s1, out=d0)
        sub(s0, s1, out=d1)


def fwht(x: np.ndarray) -> np.ndarray:
    """Orthonormal Walsh-Hadamard transform over the last axis (a power of two)."""
    n = x.shape[-1]
    a = np.array(x, copy=True).reshape(-1, n)
    stages, last = _butterflies(a, np.empty_like(a))
    _run_butterflies(stages)
    last *= last.dtype.type(1.0 / np.sqrt(n))
    return last.reshape(x.shape)


class RowRotation:
    """`rotate` for one shape of float32 rows [rows, K], its buffers and views
    made once (a prepared QuantizeRows calls it per token): the same
    arithmetic in the same order, so the same bits. Returns its own buffer."""

    def __init__(self, rot: Rotation, rows: int) -> None:
        k, n = rot.size, rot.block
        f32 = np.float32
        self.signs = rot.signs.astype(f32)
        self.first = np.empty((rows, k), f32)
        self.stages, last = _butterflies(self.first.reshape(-1, n), np.empty((rows * (k // n), n), f32))
        self.last = last.reshape(rows, k // n, n)
        self.norm = f32(1.0 / np.sqrt(n))
        self.factor = None if rot.factor is None else rot.factor.astype(f32)
        self.mixed = None if rot.factor is None else np.empty((rows, k // n, n), f32)
        self.shape = (rows, k)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        np.multiply(x, self.signs, out=self.first)
        _run_butterflies(self.stages)
        np.multiply(self.last, self.norm, out=self.last)
        if self.factor is None:
            return self.last.reshape(self.shape)
        np.matmul(self.factor, self.last, out=self.mixed)  # F mixes the blocks
        return self.mixed.reshape(self.shape)


def rotate(x: np.ndarray, rot: Rotation) -> np.ndarray:
    """x R for rows x [..., K] (same dtype as x for float32/float64)."""
    y = x * rot.signs.astype(x.dtype)
    y = fwht(y.reshape(*x.shape[:-1], -1, rot.block))
    if rot.factor is not None:
        y = np.matmul(rot.factor.astype(y.dtype), y)  # F mixes the blocks
    return y.reshape(x.shape)


def unrotate(x: np.ndarray, rot: Rotation) -> np.ndarray:
    """x R^T (the inverse of rotate)."""
    y = x.reshape(*x.shape[:-1], -1, rot.block)
    if rot.factor is not None:
        y = np.matmul(rot.factor.T.astype(y.dtype), y)
    y = fwht(y)  # the orthonormal Walsh-Hadamard matrix is its own inverse
    return y.reshape(x.shape) * rot.signs.astype(x.dtype)



@dataclass(frozen=True)
class CompiledForm:
    """R's operands as the compiled row kernels take them (jit.hadamard_rows,
    unhadamard_rows and their many-row forms): float32 signs, the block, the
    1/sqrt(block) of each stage's orthonormal scaling, and F (for unrotate
    F^T) in float32 for numpy's product, whose BLAS sums the plain kernels'
    rotate/unrotate also get."""
    signs: np.ndarray  # [K] float32, contiguous
    block: int
    norm: np.float32
    factor: np.ndarray | None  # [m, m] float32 F
    factor_t: np.ndarray | None  # F^T, as unrotate makes it


def compiled_form(rot: Rotation | None, k: int) -> CompiledForm | None:
    """The compiled kernels' operands of R over rows of K, or None where they
    cannot apply it (a crafted rkbin's attributes: a block that is not a power
    of two or does not divide K, a factor of the wrong order): the caller then
    keeps the general kernel, which reports the mismatch."""
    if rot is None or rot.size != k:
        return None
    block = int(rot.block)
    if block < 1 or block & (block - 1) or k % block:
        return None
    if rot.factor is not None and tuple(rot.factor.shape) != (k // block,) * 2:
        return None
    factor = None if rot.factor is None else rot.factor.astype(np.float32)
    return CompiledForm(np.ascontiguousarray(rot.signs, np.float32), block, np.float32(1.0 / np.sqrt(block)),
                        factor, None if factor is None else rot.factor.T.astype(np.float32))


# -- construction (compile time) --------------------------------------------------------------

def _is_prime(p: int) -> bool:
    return p >= 2 and all(p % d for d in range(2, int(p ** 0.5) + 1))


def _jacobsthal(q: int) -> np.ndarray:
    squares = {(i * i) % q for i in range(1, q)}
    chi = np.array([0] + [1 if i in squares else -1 for i in range(1, q)])
    return chi[(np.arange(q)[None, :] - np.arange(q)[:, None]) % q]


def paley_hadamard(m: int) -> np.ndarray | None:
    """A Hadamard matrix of order m by Paley's construction I (m - 1 prime,
    = 3 mod 4) or II (m / 2 - 1 prime, = 1 mod 4); None when neither applies."""
    if m == 1:
        return np.ones((1, 1))
    if m == 2:
        return np.array([[1.0, 1.0], [1.0, -1.0]])
    q = m - 1
    if _is_prime(q) and q % 4 == 3:
        s = np.zeros((m, m))
        s[0, 1:], s[1:, 0] = 1, -1
        s[1:, 1:] = _jacobsthal(q)
        return s + np.eye(m)
    if m % 2 == 0 and _is_prime(m // 2 - 1) and (m // 2 - 1) % 4 == 1:
        q = m // 2 - 1
        c = np.zeros((q + 1, q + 1))
        c[0, 1:], c[1:, 0] = 1, 1
        c[1:, 1:] = _jacobsthal(q)
        a, b = np.array([[1.0, -1.0], [-1.0, -1.0]]), np.array([[1.0, 1.0], [1.0, -1.0]])
        return np.kron(c, a) + np.kron(np.eye(q + 1), b)
    return None


def _power_of_two_part(k: int) -> int:
    return k & -k


def hartley_matrix(m: int) -> np.ndarray:
    """The orthonormal Hartley matrix of order m, cas(2 pi i j / m) / sqrt(m)
    (float64; symmetric and its own inverse; entries at most sqrt(2 / m))."""
    angle = (2 * np.pi / m) * (np.outer(np.arange(m), np.arange(m)) % m)
    return (np.cos(angle) + np.sin(angle)) / np.sqrt(m)


def hartley_split(m: int) -> tuple[int, int, np.ndarray, np.ndarray] | None:
    """The prime-factor (Good-Thomas) form of the order-m Hartley matrix, for
    m = m1 m2 with m1, m2 > 1 coprime (the pair with the least m1 + m2), else
    None: (m1, m2, pin, pout) with H_m x = y where, for X[n1, n2] =
    x[pin[n1, n2]] and T = H_m1 X H_m2^T (each factor orthonormal Hartley),
    y[pout[k1, k2]] = (T[k1, k2] + T[-k1, k2] + T[k1, -k2] - T[-k1, -k2]) / 2
    (indices mod m1, m2; cas(a + b) = (cas a cas b + cas -a cas b + cas a
    cas -b - cas -a cas -b) / 2). m1 + m2 multiply-adds a value, not m:
    8960's C35 takes 12."""
    pairs = [(a, m // a) for a in range(2, m) if m % a == 0 and a < m // a and np.gcd(a, m // a) == 1]
    if not pairs:
        return None
    m1, m2 = min(pairs, key=sum)
    n1, n2 = np.arange(m1)[:, None], np.arange(m2)[None, :]
    pin = (n1 * m2 + n2 * m1) % m  # the input's index map, and the output's by the Chinese remainder theorem
    pout = (n1 * m2 * pow(m2, -1, m1) + n2 * m1 * pow(m1, -1, m2)) % m
    return m1, m2, pin.astype(np.int64), pout.astype(np.int64)


def _flat_factor(k: int) -> tuple[int, np.ndarray] | None:
    """(n, H_m / sqrt(m)) for the largest power-of-two block n of k whose
    cofactor m has a Paley Hadamard matrix; None when none has."""
    n = _power_of_two_part(k)
    while n > 1:
        h = paley_hadamard(k // n)
        if h is not None:
            return n, h / np.sqrt(k // n)
        n //= 2
    return None


def make_rotation(k: int, kind: str = "auto", seed: int = 0) -> Rotation:
    """The rotation of rows of length k (seeded: the same k and seed give the same R)."""
    if kind not in KINDS:
        raise ValueError(f"rotation kind {kind!r} (choose {' or '.join(KINDS)})")
    rng = np.random.default_rng([seed, k])
    signs = rng.choice(np.array([-1.0, 1.0], np.float32), size=k)
    n = _power_of_two_part(k)
    if kind == "block" or n == k:
        return Rotation(signs, n)
    flat = None if kind == "hartley" else _flat_factor(k)
    if kind == "auto" and flat is not None and k // flat[0] > FLAT_FACTOR_LIMIT:
        flat = None
    if flat is not None:
        return Rotation(signs, flat[0], flat[1].astype(np.float32))
    if kind in ("auto", "hartley"):
        return Rotation(signs, n, hartley_matrix(k // n).astype(np.float32))
    q, r = np.linalg.qr(rng.standard_normal((k // n, k // n)))
    return Rotation(signs, n, (q * np.sign(np.diag(r))).astype(np.float32))


def describe(rot: Rotation) -> str:
    m = rot.size // rot.block
    if rot.factor is None:
        return f"{m} x H{rot.block}" if m > 1 else f"H{rot.block}"
    if paley_hadamard(m) is not None:
        letter = "H"
    elif np.array_equal(rot.factor, hartley_matrix(m).astype(np.float32)):
        letter = "C"  # cas
    else:
        letter = "Q"
    return f"{letter}{m} (x) H{rot.block}"
