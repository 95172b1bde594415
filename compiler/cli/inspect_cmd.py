"""`rkc inspect MODEL.rkbin`: summary, segment graph, per-layer table."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import click

from rkc.compiler.inspect import figures, layers_csv, summary
from rkc.compiler.inspect.picture import picture, write_pictures
from rkc.compiler.llm.cpu_work import load_host_costs
from rkc.compiler.llm.report import figures as llm_figures
from rkc.compiler.llm.report import summary_lines
from rkc.compiler.probe.dram import bandwidth_from
from rkc.ir.atomic import write_atomic
from rkc.ir.npu.perf import PerfModel
from rkc.ir.rkbin import read_rkbin


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--dot", "dot_path", type=click.Path(dir_okay=False), help="Write the segment graph as Graphviz DOT.")
@click.option("--svg", "svg_path", type=click.Path(dir_okay=False), help="Draw the segment graph as SVG (needs `dot`).")
@click.option("--png", "png_path", type=click.Path(dir_okay=False), help="Draw the segment graph as PNG (needs `dot`).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False),
              help="Write a per-layer table: op, device, MACs, DDR bytes, modelled cycles.")
@click.option("--program", help="Which program's segment graph (default: decode for an LLM, else the first).")
@click.option("--full", is_flag=True,
              help="Draw every step; by default an LLM's layers of one structure are drawn once, with their count.")
@click.option("--json", "as_json", is_flag=True,
              help="The modelled figures as JSON (tasks, kicks, DDR bytes, NPU time; LLMs per token and chunk).")
@click.option("--json-file", "json_path", type=click.Path(dir_okay=False),
              help="Write the --json figures to this file instead of printing them.")
@click.option("--dram-gbps", metavar="GBPS|PROBE.json",
              help="Model with this DRAM bandwidth: GB/s, or a report of `rkc probe --dram` (default: the "
                   "performance model's, ir/npu/hw.py).")
@click.option("--host-costs", "host_costs", type=click.Path(dir_okay=False),
              help="LLMs: host costs measured by bench/llm.py --host-costs; says whether the NPU decode "
                   "beats llama.cpp's CPU decode once they are paid.")
def inspect_command(model: str, dot_path: str | None, svg_path: str | None, png_path: str | None,
                    csv_path: str | None, program: str | None, full: bool, as_json: bool,
                    json_path: str | None, dram_gbps: str | None, host_costs: str | None) -> None:
    """Summarise MODEL: segments, ops per device, tasks and kicks, weight and
    activation bytes, modelled NPU time (LLMs: per decode token and prefill chunk)."""
    perf = PerfModel()
    if dram_gbps:
        bandwidth, source = bandwidth_from(dram_gbps)
        perf = replace(perf, dram_bytes_per_s=bandwidth)
        if not as_json:
            click.echo(f"DRAM bandwidth: {source}")
    rkbin = read_rkbin(model)
    module = rkbin.module
    llm = module.metadata.get("model_kind") == "llm"
    if as_json or json_path:
        if llm:
            text = json.dumps(llm_figures(module, perf), indent=1)
        else:
            text = json.dumps(figures(module, perf), indent=1)
        if json_path:
            write_atomic(json_path, text + "\n")
        else:
            click.echo(text)
            return
    if llm:
        costs = load_host_costs(host_costs, module.metadata.get("precision", "?")) if host_costs else None
        for line in summary_lines(module, perf, costs):
            click.echo(line)
    else:
        for line in summary(module, perf):
            click.echo(line)
    drawings = {fmt: path for fmt, path in (("svg", svg_path), ("png", png_path)) if path}
    if dot_path or drawings:
        pic = picture(module, Path(model).stem, program, full)
        click.echo(pic.describe())
        write_pictures(pic, dot_path, drawings)
    if csv_path:
        write_atomic(csv_path, layers_csv(module))
