"""The DPU's lookup table (EW stage; NVDLA SDP LE/LO hybrid tables), as the
HW-validated activation programs use it (gregordinary/rockchip-npu-notes
encodings/dpu-lut-activation.md; allbilly/rk3588 experimental/act_lut_readme.md):

* two 513-entry tables of signed 16-bit values, uploaded through
  LUT_ACCESS_CFG / LUT_ACCESS_DATA (auto-incrementing address);
* LE covers the index range [LE_START, 0], LO covers [0, LO_END], in steps of
  2**LUT_*_INDEX_SELECT, interpolated linearly; the hybrid mux (LO_LE_MUX = 2,
  HYBRID/OFLOW priority LO) takes LE for negative indices and LO otherwise;
* below LE_START / above LO_END the value extrapolates from the end entry with
  the LE underflow / LO overflow slope (scale / 2**shift per index unit).

Only that configuration is modelled (open question Q18): other LUT_CFG values,
other table geometries and tables holding an entry of exactly 0 (which decodes
as ~4.0 on silicon) raise. The output is rounded to an integer Q value, which
OUT_CVT then decodes.
"""

from __future__ import annotations

import numpy as np

from rkc.runtime.sim.errors import QuirkRejection, StaleRegisterError, UnsupportedError
from rkc.runtime.sim.regfile import TaskRegisters

ENTRIES = 513
SEGMENTS = ENTRIES - 1
VALIDATED_CFG = {"LUT_CAL_SEL": 0, "LUT_HYBRID_PRIORITY": 1, "LUT_OFLOW_PRIORITY": 1,
                 "LUT_UFLOW_PRIORITY": 0, "LUT_LO_LE_MUX": 2, "LUT_EXPAND_EN": 0, "LUT_ROAD_SEL": 0}


def _s32(v: int) -> int:
    return v - (1 << 32) if v >> 31 else v


def _s16(v: int) -> int:
    return v - (1 << 16) if v >> 15 else v


def apply(r: TaskRegisters, tables: np.ndarray, written: set, x: np.ndarray) -> np.ndarray:
    """x: index values (float32) -> interpolated table values (float32, integral)."""
    cfg = r.fields("DPU_LUT_CFG")
    if dict(cfg) != VALIDATED_CFG:
        raise r.error(UnsupportedError, f"LUT_CFG {dict(cfg)}: only the validated hybrid configuration "
                      "(LO_LE_MUX=2, hybrid and overflow priority LO) is modelled (Q18)", "DPU_LUT_CFG")
    info = r.fields("DPU_LUT_INFO")
    le_sel, lo_sel = info["LUT_LE_INDEX_SELECT"], info["LUT_LO_INDEX_SELECT"]
    le_start = _s32(r.value("DPU_LUT_LE_START"))
    lo_start = _s32(r.value("DPU_LUT_LO_START"))
    lo_end = _s32(r.value("DPU_LUT_LO_END"))
    if le_sel > 20 or lo_sel > 20 or lo_start != 0 or le_start != -(SEGMENTS << le_sel) \
            or lo_end != SEGMENTS << lo_sel:
        raise r.error(UnsupportedError, f"LUT geometry LE_START={le_start}, LO_START={lo_start}, "
                      f"LO_END={lo_end}, index selects {le_sel}/{lo_sel}: only LE = [-512*2^s, 0] and "
                      "LO = [0, 512*2^s] are modelled (Q18)", "DPU_LUT_INFO")
    for t, name in ((0, "LE"), (1, "LO")):
        missing = [a for a in range(ENTRIES) if (t, a) not in written]
        if missing:
            raise r.error(StaleRegisterError, f"the {name} table entries {missing[0]}..{missing[-1]} were not "
                          "uploaded in this task (LUT memory is not trusted across tasks)", "DPU_LUT_ACCESS_DATA")
        if (tables[t] == 0).any():
            raise r.error(QuirkRejection, f"the {name} table holds an entry of exactly 0, which decodes as ~4.0 "
                          "on silicon (dpu-lut-activation.md; store 1 instead)", "DPU_LUT_ACCESS_DATA")
    le = tables[0].astype(np.float64)
    lo = tables[1].astype(np.float64)
    slope = {}
    for side, f in (("LE", "UFLOW"), ("LO", "OFLOW")):
        sc = r.fields(f"DPU_LUT_{side}_SLOPE_SCALE")[f"LUT_{side}_SLOPE_{f}_SCALE"]
        sh = r.fields(f"DPU_LUT_{side}_SLOPE_SHIFT")[f"LUT_{side}_SLOPE_{f}_SHIFT"]
        slope[side] = _s16(sc) / float(1 << sh)
    xi = np.asarray(x, np.float64)
    out = np.empty_like(xi)
    neg = xi < 0
    out[neg] = _interp(le, xi[neg], le_start, le_sel, slope["LE"], under=True)
    out[~neg] = _interp(lo, xi[~neg], lo_start, lo_sel, slope["LO"], under=False)
    return np.rint(out).astype(np.float32)


def _interp(table: np.ndarray, x: np.ndarray, start: int, sel: int, slope: float, under: bool) -> np.ndarray:
    step = float(1 << sel)
    pos = (x - start) / step
    end = start + SEGMENTS * step
    res = np.empty_like(x)
    inside = (pos >= 0) & (pos <= SEGMENTS)
    i = np.clip(np.floor(pos[inside]).astype(np.int64), 0, SEGMENTS - 1)
    frac = pos[inside] - i
    res[inside] = table[i] + frac * (table[i + 1] - table[i])
    below = pos < 0
    above = pos > SEGMENTS
    # LE extrapolates below its start with its underflow slope; LO above its end
    # with its overflow slope; the other ends clamp to the end entry
    res[below] = table[0] + ((x[below] - start) * slope if under else 0.0)
    res[above] = table[SEGMENTS] + (0.0 if under else (x[above] - end) * slope)
    return res
