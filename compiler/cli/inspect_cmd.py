"""`rkc inspect MODEL.rkbin`: summary, segment graph, per-layer table."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from rkc.compiler.inspect import figures, layers_csv, render_svg, segment_graph, summary, to_dot
from rkc.compiler.probe.dram import bandwidth_from
from rkc.ir.atomic import write_atomic
from rkc.ir.npu.perf import PerfModel
from rkc.ir.rkbin import read_rkbin


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--dot", "dot_path", type=click.Path(dir_okay=False), help="Write the segment graph as Graphviz DOT.")
@click.option("--svg", "svg_path", type=click.Path(dir_okay=False), help="Render the segment graph to SVG (needs `dot`).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False),
              help="Write a per-layer table: op, device, MACs, DDR bytes, modelled cycles.")
@click.option("--program", help="Which program's segment graph (default: the first).")
@click.option("--json", "as_json", is_flag=True,
              help="The modelled figures as JSON (tasks, kicks, DDR bytes, NPU time; LLMs per token and chunk).")
@click.option("--dram-gbps", metavar="GBPS|PROBE.json",
              help="Model with this DRAM bandwidth: GB/s, or a report of `rkc probe --dram` (default: the "
                   "performance model's, ir/npu/hw.py).")
def inspect_command(model: str, dot_path: str | None, svg_path: str | None, csv_path: str | None,
                    program: str | None, as_json: bool, dram_gbps: str | None) -> None:
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
    if as_json:
        import json

        if llm:
            from rkc.compiler.llm.report import figures as llm_figures

            click.echo(json.dumps(llm_figures(module, perf), indent=1))
        else:
            click.echo(json.dumps(figures(module, perf), indent=1))
        return
    if llm:
        from rkc.compiler.llm.report import summary_lines

        for line in summary_lines(module, perf):
            click.echo(line)
    else:
        for line in summary(module, perf):
            click.echo(line)
    prog = module.program(program) if program else None
    if dot_path or svg_path:
        dot = to_dot(segment_graph(module, prog), Path(model).stem)
        if svg_path:
            write_atomic(svg_path, render_svg(dot))
        if dot_path:
            write_atomic(dot_path, dot)
    if csv_path:
        write_atomic(csv_path, layers_csv(module))
