"""The RK3588 outside the NPU that decides LLM speed: the memory controller
(dmc devfreq) and the CPU clusters (cpufreq, the A76 2.4 GHz OPP and the
PVTM speed-bin mask that can hide it). Facts and OK/WARN/FAIL checks.

Decode is bound by DRAM bandwidth, so a board whose DDR sits at a low rate,
or cannot be pinned at its top rate, loses most of its speed before the NPU
does anything. Seed report 003 ("Board provisioning for the ROCK 5B+") found
both problems on a real board: no dmc devfreq device, because the
bootloader's upstream TF-A BL31 lacks the DDR services, and the A76 cores
capped at 2304 MHz by the speed bin (the second cell of opp-supported-hw is
a pvtm-volt-sel mask). docs/board.md says what to do, in order.

Standard library only, and no rkc imports: kernel/check-npu loads this file
by path on boards where rkc is not installed; `rkc doctor` imports it. Every
path is read below a root directory, so tests point it at fake trees.
"""

from __future__ import annotations

import os

MHZ = 1_000_000
KHZ = 1_000
A76_TOP_HZ = 2_400_000_000
#: the 2.4 GHz node of the A76 OPP tables (mainline rk3588-opp.dtsi and the vendor rk3588s.dtsi)
A76_TOP_OPP = "opp-2400000000"
#: MIDR_EL1 part numbers (bits 15:4) of the RK3588's cores
MIDR_PARTS = {0xD0B: "A76", 0xD05: "A55"}
DMC_COMPATIBLE = "rockchip,rk3588-dmc"
A76_COMPATIBLE = "arm,cortex-a76"
DEVFREQ = "sys/class/devfreq"
CPUFREQ = "sys/devices/system/cpu/cpufreq"
CPUS = "sys/devices/system/cpu"
DT_ROOTS = ("sys/firmware/devicetree/base", "proc/device-tree")
#: kernel/dts/rk3588-a76-2400.dtso marks the OPP nodes it opens with this property
OVERLAY_PROP, OVERLAY_NAME = "rkc,overlay", "rk3588-a76-2400"
#: an opp-supported-hw second cell that admits every pvtm-volt-sel
ALL_VOLT_SELS = 0xFFFF
PIN_GOVERNOR = "performance"

OK, WARN, FAIL, INFO = "OK", "WARN", "FAIL", "INFO"


# --------------------------------------------------------------------------
# Reading sysfs and the device tree


def read_text(root: str, *parts: str) -> str | None:
    try:
        with open(os.path.join(root, *parts), "rb") as f:
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return None


def read_int(root: str, *parts: str, base: int = 10) -> int | None:
    value = read_text(root, *parts)
    try:
        return int(value, base) if value is not None else None
    except ValueError:
        return None


def prop(node: str, name: str) -> bytes | None:
    try:
        with open(os.path.join(node, name), "rb") as f:
            return f.read()
    except OSError:
        return None


def prop_strings(raw: bytes | None) -> list[str]:
    return [s.decode("utf-8", "replace") for s in raw.split(b"\0") if s] if raw else []


def prop_cells(raw: bytes | None, width: int = 4) -> list[int]:
    if not raw:
        return []
    return [int.from_bytes(raw[i:i + width], "big") for i in range(0, len(raw) - width + 1, width)]


def dt_root(root: str) -> str | None:
    for rel in DT_ROOTS:
        if os.path.isdir(os.path.join(root, rel)):
            return os.path.join(root, rel)
    return None


def dt_nodes(base: str):
    for dirpath, dirnames, _ in os.walk(base):
        dirnames.sort()
        yield dirpath


def _words(text: str | None) -> list[str]:
    return text.split() if text else []


def read_dmc(root: str) -> dict | None:
    """The dmc devfreq device (rates in Hz), or None when there is none."""
    base = os.path.join(root, DEVFREQ)
    names = sorted(os.listdir(base)) if os.path.isdir(base) else []
    for name in [n for n in names if n == "dmc"] + [n for n in names if n != "dmc" and n.endswith("dmc")]:
        rates = sorted(int(w) for w in _words(read_text(root, DEVFREQ, name, "available_frequencies"))
                       if w.isdigit())
        return {"name": name, "path": "/" + os.path.join(DEVFREQ, name),
                "governor": read_text(root, DEVFREQ, name, "governor"),
                "available_governors": _words(read_text(root, DEVFREQ, name, "available_governors")),
                "cur_hz": read_int(root, DEVFREQ, name, "cur_freq"),
                "min_hz": read_int(root, DEVFREQ, name, "min_freq"),
                "max_hz": read_int(root, DEVFREQ, name, "max_freq"),
                "rates_hz": rates}
    return None


def _policy_cores(root: str, cpus: list[int]) -> str | None:
    parts = set()
    for cpu in cpus:
        midr = read_int(root, CPUS, f"cpu{cpu}", "regs/identification/midr_el1", base=16)
        if midr is not None:
            parts.add(MIDR_PARTS.get((midr >> 4) & 0xFFF, "part %#x" % ((midr >> 4) & 0xFFF)))
    return "/".join(sorted(parts)) or None


def read_cpufreq(root: str) -> list[dict]:
    """One entry per cpufreq policy (frequencies in kHz, as sysfs gives them)."""
    base = os.path.join(root, CPUFREQ)
    if not os.path.isdir(base):
        return []
    out = []
    for name in sorted((n for n in os.listdir(base) if n.startswith("policy") and n[6:].isdigit()),
                       key=lambda n: int(n[6:])):
        def r(f):
            return read_int(root, CPUFREQ, name, f)
        cpus = [int(w) for w in _words(read_text(root, CPUFREQ, name, "related_cpus")) if w.isdigit()]
        of_node = os.path.join(root, CPUS, f"cpu{cpus[0]}", "of_node") if cpus else None
        out.append({"policy": name, "cpus": cpus, "cores": _policy_cores(root, cpus),
                    "governor": read_text(root, CPUFREQ, name, "scaling_governor"),
                    "cur_khz": r("scaling_cur_freq"), "max_khz": r("scaling_max_freq"),
                    "hw_max_khz": r("cpuinfo_max_freq"),
                    "available_khz": sorted(int(w) for w in _words(read_text(
                        root, CPUFREQ, name, "scaling_available_frequencies")) if w.isdigit()),
                    "dt_node": os.path.realpath(of_node) if of_node and os.path.exists(of_node) else None})
    return out


def _opp_table(node: str) -> dict:
    points = {}
    for child in sorted(os.listdir(node)):
        path = os.path.join(node, child)
        hz = prop_cells(prop(path, "opp-hz"), 8)
        if os.path.isdir(path) and hz:
            points[hz[0]] = {"node": child, "supported_hw": prop_cells(prop(path, "opp-supported-hw")),
                             "overlay": (prop_strings(prop(path, OVERLAY_PROP)) or [None])[0]}
    return {"node": os.path.basename(node), "opps": points}


def read_dt(root: str) -> dict | None:
    """The dmc nodes and the OPP tables of the A76 cpu nodes (keyed by the cpu node's path)."""
    base = dt_root(root)
    if base is None:
        return None
    by_phandle, dmc, a76 = {}, [], []
    for node in dt_nodes(base):
        cells = prop_cells(prop(node, "phandle"))
        if cells:
            by_phandle[cells[0]] = node
        compatible = prop_strings(prop(node, "compatible"))
        if DMC_COMPATIBLE in compatible:
            status = prop_strings(prop(node, "status"))
            dmc.append({"node": os.path.basename(node), "enabled": not status or status[0] in ("okay", "ok")})
        if A76_COMPATIBLE in compatible:
            a76.append(node)
    tables = {}
    for node in a76:
        ref = prop_cells(prop(node, "operating-points-v2"))
        table = by_phandle.get(ref[0]) if ref else None
        tables[os.path.realpath(node)] = _opp_table(table) if table else None
    return {"dmc": dmc, "a76_tables": tables}


def gather(root: str = "/") -> dict:
    return {"dmc": read_dmc(root), "cpufreq": read_cpufreq(root), "device_tree": read_dt(root)}


# --------------------------------------------------------------------------
# Judging


def _mhz(hz: float) -> str:
    return "%g MHz" % (hz / MHZ)


def _bits(mask: int) -> list[int]:
    return [b for b in range(16) if mask >> b & 1]


def judge_dmc(facts: dict) -> list[tuple[str, str, str]]:
    checks = []
    add = checks.append
    dmc, dt = facts["dmc"], facts["device_tree"]
    if dmc is None:
        nodes = (dt or {}).get("dmc", [])
        if any(n["enabled"] for n in nodes):
            add((FAIL, "DDR devfreq", "none, though the device tree enables %s (%s): the bootloader's BL31 "
                 "probably lacks the DDR services (upstream TF-A has Rockchip's SIP dispatcher but no DDR "
                 "DVFS behind it), so the DDR rate can be neither read nor pinned; rebuild U-Boot with "
                 "rkbin's BL31 (docs/board.md, step 2)" % (nodes[0]["node"], DMC_COMPATIBLE)))
        elif nodes:
            add((FAIL, "DDR devfreq", "none: the device tree's %s node is disabled; enable it (status = "
                 "\"okay\") and boot a BL31 with the DDR services (rkbin's; docs/board.md, step 2)"
                 % nodes[0]["node"]))
        else:
            add((WARN, "DDR devfreq", "none, and no %s node: the DDR rate can be neither read nor pinned "
                 "from Linux (mainline has no RK3588 DMC driver; the DDR keeps the rate the bootloader "
                 "trained). Measure what it gives: rkc probe --dram (docs/board.md, step 2)" % DMC_COMPATIBLE))
        return checks

    rates, path = dmc["rates_hz"], dmc["path"]
    top = rates[-1] if rates else dmc["max_hz"]
    add((OK, "DDR devfreq", "%s: rates %s" % (path, ", ".join("%g" % (r / MHZ) for r in rates) + " MHz"
                                            if rates else "unknown (no available_frequencies)")))
    gov, govs = dmc["governor"], dmc["available_governors"]
    fix = "echo %s | sudo tee %s/governor" % (PIN_GOVERNOR, path)
    if gov == PIN_GOVERNOR:
        add((OK, "DDR governor", gov))
    elif gov == "powersave":
        add((FAIL, "DDR governor", "powersave: holds the DDR at its lowest rate, and decode is bound by "
             "DDR bandwidth; %s" % fix))
    elif gov == "userspace":
        add((OK if dmc["cur_hz"] == top else WARN, "DDR governor",
             "userspace (the rate is whatever was written to %s/userspace/set_freq)" % path))
    else:
        add((WARN, "DDR governor", "%s: the rate follows the load, so a measurement mixes rates; pin it "
             "for a run: %s" % (gov, fix)))

    cur = dmc["cur_hz"]
    capped = dmc["max_hz"] is not None and top is not None and dmc["max_hz"] < top
    if cur is None or top is None:
        add((WARN, "DDR rate", "unknown (cur_freq or available_frequencies unreadable)"))
    elif capped:
        add((WARN, "DDR rate", "%s; max_freq caps it at %s of %s: echo %d | sudo tee %s/max_freq"
             % (_mhz(cur), _mhz(dmc["max_hz"]), _mhz(top), top, path)))
    elif cur >= top and gov in (PIN_GOVERNOR, "userspace"):
        add((OK, "DDR rate", "%s, its top rate, held there by the %s governor" % (_mhz(cur), gov)))
    elif gov == PIN_GOVERNOR:
        add((WARN, "DDR rate", "%s of %s under the performance governor: something else holds it down "
             "(thermal or firmware; dmesg | grep -i dmc)" % (_mhz(cur), _mhz(top))))
    elif PIN_GOVERNOR in govs or "userspace" in govs:
        add((WARN, "DDR rate", "%s of %s; it can be held at %s for a run: %s"
             % (_mhz(cur), _mhz(top), _mhz(top), fix if PIN_GOVERNOR in govs else
                "echo userspace > %s/governor; echo %d > %s/userspace/set_freq" % (path, top, path))))
    else:
        add((FAIL, "DDR rate", "%s of %s, and it cannot be held at its top rate: no performance or "
             "userspace governor (available: %s)" % (_mhz(cur), _mhz(top), " ".join(govs) or "none")))
    return checks


def _volt_sel_guess(table: dict, offered_hz: set[int]) -> list[int]:
    """The pvtm-volt-sel values consistent with which masked OPPs the kernel offers."""
    masked = {hz: p["supported_hw"][1] for hz, p in table["opps"].items()
              if len(p["supported_hw"]) > 1 and p["supported_hw"][1] != ALL_VOLT_SELS}
    candidates = set(range(16))
    for hz, mask in masked.items():
        candidates = candidates & set(_bits(mask)) if hz in offered_hz else candidates - set(_bits(mask))
    return sorted(candidates) if len(candidates) < 16 else []


def _why_not_2400(table: dict | None, offered_hz: set[int]) -> str:
    if table is None:
        return "no OPP table for it in the device tree"
    point = table["opps"].get(A76_TOP_HZ)
    if point is None:
        return "its OPP table %s has no %s" % (table["node"], A76_TOP_OPP)
    hw = point["supported_hw"]
    if point["overlay"] or len(hw) < 2 or hw[1] == ALL_VOLT_SELS:
        return ("%s/%s is in the device tree%s but the kernel does not offer it (dmesg | grep -i opp: "
                "a voltage outside the regulator's range?)"
                % (table["node"], A76_TOP_OPP, " with the %s overlay" % point["overlay"] if point["overlay"] else ""))
    sel = _volt_sel_guess(table, offered_hz)
    return ("hidden by the PVTM speed bin: %s/%s has opp-supported-hw <%s>, whose second cell is a "
            "pvtm-volt-sel mask admitting volt-sel %s, and this die's volt-sel is %s (dmesg | grep -i volt-sel); "
            "kernel/dts/%s.dtso exposes it (reversible; the risk: kernel/README.md)"
            % (table["node"], A76_TOP_OPP, " ".join("%#x" % c for c in hw),
               ", ".join(map(str, _bits(hw[1]))) or "none",
               " or ".join(map(str, sel)) if sel else "another", OVERLAY_NAME))


def judge_cpus(facts: dict) -> list[tuple[str, str, str]]:
    checks = []
    add = checks.append
    policies, dt = facts["cpufreq"], facts["device_tree"]
    tables = (dt or {}).get("a76_tables", {})
    if not policies:
        add((WARN, "CPU clocks", "no cpufreq policies (/%s): the cores keep their boot rate; the kernel "
             "needs CONFIG_CPUFREQ_DT and the cpu OPP tables" % CPUFREQ))
        return checks

    a76 = [p for p in policies if p["cores"] == "A76"]
    if not a76:
        add((WARN, "A76 clock", "no policy identified as Cortex-A76 (midr_el1 unreadable under /%s/cpu*/regs)"
             % CPUS))
    for p in a76:
        label = "%s (cpu%s)" % (p["policy"], ",".join(map(str, p["cpus"])))
        offered = {k * KHZ for k in p["available_khz"]}
        hw_max, cap = (p["hw_max_khz"] or 0) * KHZ, (p["max_khz"] or 0) * KHZ
        if hw_max >= A76_TOP_HZ and cap >= A76_TOP_HZ:
            add((OK, "A76 clock", "%s: max %s" % (label, _mhz(cap))))
        elif hw_max >= A76_TOP_HZ:
            add((WARN, "A76 clock", "%s: scaling_max_freq caps it at %s of %s: echo %d | sudo tee /%s/%s/"
                 "scaling_max_freq" % (label, _mhz(cap), _mhz(hw_max), hw_max // KHZ, CPUFREQ, p["policy"])))
        else:
            table = tables.get(p["dt_node"]) if p["dt_node"] in tables else next(iter(tables.values()), None)
            add((WARN, "A76 clock", "%s: tops out at %s, not %s: %s"
                 % (label, _mhz(hw_max), _mhz(A76_TOP_HZ), _why_not_2400(table, offered))))

    marked = sorted({t["node"] for t in tables.values() if t and (t["opps"].get(A76_TOP_HZ) or {}).get("overlay")})
    if marked:
        add((INFO, "A76 overlay", "%s applied (%s): the 2.4 GHz OPP is open to every speed bin, so this die "
             "may run above its bin; stress-test it, and remove the overlay if the board is unstable "
             "(kernel/README.md)" % (OVERLAY_NAME, ", ".join(marked))))
    elif any(t and A76_TOP_HZ in t["opps"] for t in tables.values()):
        tops = [t["opps"][A76_TOP_HZ]["supported_hw"] for t in tables.values() if t and A76_TOP_HZ in t["opps"]]
        if not any(len(hw) > 1 and hw[1] != ALL_VOLT_SELS for hw in tops):
            why = " (not needed: the 2.4 GHz OPP carries no speed-bin mask)"
        elif a76 and all((p["hw_max_khz"] or 0) * KHZ >= A76_TOP_HZ for p in a76):
            why = " (not needed: this die's speed bin admits 2.4 GHz)"
        else:
            why = ""
        add((INFO, "A76 overlay", "%s not applied%s" % (OVERLAY_NAME, why)))

    loose = ["%s: %s" % (p["policy"], p["governor"]) for p in policies if p["governor"] != PIN_GOVERNOR]
    if loose:
        add((WARN, "CPU governor", "%s: the clock follows the load, so a measurement mixes rates; pin it for "
             "a run: echo %s | sudo tee /%s/policy*/scaling_governor" % ("; ".join(loose), PIN_GOVERNOR, CPUFREQ)))
    else:
        add((OK, "CPU governor", "%s on %s" % (PIN_GOVERNOR, ", ".join(p["policy"] for p in policies))))
    return checks


def clocks_line(facts: dict) -> str:
    """The DDR and CPU clocks a measurement ran at, in one line (a bandwidth
    figure means little without the DDR rate it was taken at)."""
    dmc = facts["dmc"]
    if dmc is None:
        ddr = "DDR rate unknown (no dmc devfreq device)"
    else:
        top = dmc["rates_hz"][-1] if dmc["rates_hz"] else dmc["max_hz"]
        ddr = "DDR %s%s (%s)" % (_mhz(dmc["cur_hz"]) if dmc["cur_hz"] else "rate unknown",
                                 " of %s" % _mhz(top) if top and top != dmc["cur_hz"] else "", dmc["governor"] or "?")
    cpus = ["%s%s %s (%s)" % (p["policy"], " " + p["cores"] if p["cores"] else "",
                              _mhz(p["cur_khz"] * KHZ) if p["cur_khz"] else "rate unknown", p["governor"] or "?")
            for p in facts["cpufreq"]]
    return "; ".join([ddr, *cpus]) if cpus else ddr + "; no cpufreq policies"


def judge(facts: dict) -> list[tuple[str, str, str]]:
    """The memory-controller and CPU lines, [(level, topic, message)]."""
    return judge_dmc(facts) + judge_cpus(facts)
