"""GGUF -> IR: metadata-driven graphs for every architecture, the `rkc ir`
fixed point, and one-line errors for what rkc does not support."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from rkc.compiler.cli import main as rkc
from rkc.compiler.frontend import load_graph
from rkc.compiler.frontend.gguf import GgufFile
from rkc.ir.errors import FormatError, UnsupportedError
from rkc.ir.text import parse_graph, print_graph
from llm.conftest import ARCHS
from llm.synth import SHAPES


@pytest.mark.parametrize("arch", ARCHS)
def test_graph_follows_the_metadata(arch, synth_gguf):
    g = load_graph(synth_gguf(arch))
    s = SHAPES[arch]
    cfg = GgufFile(synth_gguf(arch)).config()
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim) == (
        s["n_layer"], s["n_embd"], s["n_head"], s["n_head_kv"], s["head_dim"])
    types = [op.type for op in g.ops]
    assert types.count("Attention") == s["n_layer"]
    # 7 projections per layer + the output head
    assert types.count("Linear") == 7 * s["n_layer"] + 1
    assert ("GeluTanh" in types) == (arch == "gemma3")
    assert ("SiLU" in types) == (arch != "gemma3")
    norms = types.count("RMSNorm")
    per_layer = 2 + (2 if cfg.qk_norm else 0) + (2 if cfg.post_norms else 0)
    assert norms == per_layer * s["n_layer"] + 1
    head = [op for op in g.ops if op.outputs == ["logits"]][0]
    assert head.inputs[1] == ("token_embd.weight" if s["tied"] else "output.weight")
    ropes = [op for op in g.ops if op.type == "RoPE"]
    assert {op.attrs["mode"] for op in ropes} == {"norm" if arch == "llama" else "neox"}
    if arch == "qwen2":
        q = [op for op in g.ops if op.outputs == ["blk.0.q"]][0]
        assert q.inputs[2] == "blk.0.attn_q.bias"
    if arch == "gemma3":
        attn = [op for op in g.ops if op.type == "Attention"]
        assert [op.attrs["window"] for op in attn] == [6, 6, 0]
        # sliding layers use the SWA RoPE base, the global layer the file's
        assert [op.attrs["base"] for op in ropes[::2]] == [10000.0, 10000.0, 1e6]
        assert g.ops[1].type == "Scale" and g.ops[1].attrs["factor"] == pytest.approx(8.0)


@pytest.mark.parametrize("arch", ARCHS)
def test_rkc_ir_is_a_fixed_point(arch, synth_gguf, tmp_path):
    runner = CliRunner()
    first = runner.invoke(rkc, ["ir", str(synth_gguf(arch))])
    assert first.exit_code == 0, first.output
    assert "q(block=" in first.output and "@token_embd.weight" in first.output  # referenced, not inlined
    (tmp_path / "a.txt").write_text(first.output)
    second = runner.invoke(rkc, ["ir", str(tmp_path / "a.txt")])
    assert second.exit_code == 0, second.output
    assert second.output == first.output
    assert print_graph(parse_graph(first.output)) == first.output


def test_weights_are_dequantized_per_type(synth_gguf):
    gf = GgufFile(synth_gguf("llama"))
    kinds = {gf.type_name(n) for n in gf.tensors}
    assert kinds == {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q6_K"}
    for name in gf.tensors:
        w = gf.dequantize(name)
        assert w.shape == gf.shape(name) and w.dtype == np.float32 and np.isfinite(w).all()
    # a plain type dequantizes to itself
    f16 = next(n for n in gf.tensors if gf.type_name(n) == "F16")
    assert np.array_equal(gf.dequantize(f16), np.asarray(gf.raw(f16)).astype(np.float32).reshape(gf.shape(f16)))


def _write(path, arch="llama", tensor_type=gguf.GGMLQuantizationType.F32):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_embedding_length(32)
    w.add_block_count(0)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_context_length(64)
    w.add_tokenizer_model("llama")
    data = np.zeros((10, 32), np.float32)
    if tensor_type == gguf.GGMLQuantizationType.F32:
        w.add_tensor("token_embd.weight", data)
    else:
        w.add_tensor("token_embd.weight", gguf.quants.quantize(data, tensor_type), raw_dtype=tensor_type)
    w.add_tensor("output_norm.weight", np.ones(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_architecture_is_one_line(tmp_path):
    path = _write(tmp_path / "m.gguf", arch="mamba")
    with pytest.raises(UnsupportedError, match=r"architecture 'mamba' is not supported"):
        load_graph(path)
    r = CliRunner().invoke(rkc, ["ir", str(path)])
    assert r.exit_code == 1 and r.output.count("\n") == 1 and "mamba" in r.output


def test_unsupported_tensor_type_names_the_tensor(tmp_path):
    path = _write(tmp_path / "m.gguf", tensor_type=gguf.GGMLQuantizationType.Q4_1)
    with pytest.raises(UnsupportedError, match=r"tensor token_embd.weight has type Q4_1"):
        load_graph(path)


def test_truncated_gguf_is_a_format_error(tmp_path, synth_gguf):
    data = synth_gguf("qwen3").read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: len(data) // 3])
    with pytest.raises(FormatError):
        load_graph(bad)
    r = CliRunner().invoke(rkc, ["compile", str(bad), "-o", str(tmp_path / "x.rkbin")])
    assert r.exit_code == 1 and "truncated or corrupt" in r.output
    assert not (tmp_path / "x.rkbin").exists()
