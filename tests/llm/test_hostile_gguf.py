"""Hostile GGUF hyperparameters: wrong types, out of range, disagreeing with
each other, token ids outside the vocabulary, non-finite numbers. Each is one
FormatError at compile time (rkc compile exits 1), not a crash or a model that
compiles and then fails or prints <unk>."""

from __future__ import annotations

import math
import re

import gguf
import pytest
from click.testing import CliRunner

from llm.synth import write_model
from rkc.compiler.cli import main as rkc
from rkc.compiler.frontend.gguf import GgufFile
from rkc.ir.errors import FormatError
from rkc.ir.llm import config_from_gguf


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    gf = GgufFile(write_model(tmp_path_factory.mktemp("g") / "llama.gguf", "llama"))
    return gf.kv, gf.n_vocab()


CASES = {
    "block_count 'two'": ("llama.block_count", "two", "llama.block_count is 'two', not an integer"),
    "block_count 2.5": ("llama.block_count", 2.5, "llama.block_count is 2.5, not an integer"),
    "head_count 0": ("llama.attention.head_count", 0, r"llama.attention.head_count = 0 is outside 1\.\.1024"),
    "head_count_kv 0": ("llama.attention.head_count_kv", 0, r"head_count_kv = 0 is outside"),
    "head_count_kv 3 of 4": ("llama.attention.head_count_kv", 3, "3 KV heads do not divide the 4 attention heads"),
    "key_length 2^31": ("llama.attention.key_length", 1 << 31, "key_length = 2147483648 is outside"),
    "bos_token_id 2^31": ("tokenizer.ggml.bos_token_id", 1 << 31, "bos_token_id = 2147483648 is not a token id"),
    "eos_token_id -1": ("tokenizer.ggml.eos_token_id", -1, "eos_token_id = -1 is not a token id"),
    "context_length 0": ("llama.context_length", 0, "context_length = 0 is outside"),
    "context_length 2^40": ("llama.context_length", 1 << 40, "context_length = 1099511627776 is outside"),
    "rope.freq_base 'fast'": ("llama.rope.freq_base", "fast", "rope.freq_base is 'fast', not a number"),
    "NaN RMS epsilon": ("llama.attention.layer_norm_rms_epsilon", math.nan, "epsilon = nan must be finite"),
    "negative RMS epsilon": ("llama.attention.layer_norm_rms_epsilon", -1e-5, "must be finite and > 0"),
    "inf rope base": ("llama.rope.freq_base", math.inf, "rope.freq_base = inf must be finite"),
    "odd RoPE dims": ("llama.rope.dimension_count", 7, "RoPE rotates 7 dimensions"),
    "embedding_length bool": ("llama.embedding_length", True, "not an integer"),
}


# tensors whose shape disagrees with what the architecture and the hyperparameters give them (the tiny llama:
# D 64, 4 heads and 2 KV heads of 16, FFN 256, vocabulary 433), numpy order; checked before any arithmetic
TENSOR_CASES = {
    "attn_q [64, 32]": ({"blk.0.attn_q.weight": (64, 32)}, r"blk.0.attn_q.weight has shape \[64, 32\], but this "
                        r"llama model \(its hyperparameters\) needs \[64, 64\]"),
    "attn_k [64, 64]": ({"blk.1.attn_k.weight": (64, 64)}, r"blk.1.attn_k.weight has shape \[64, 64\].* \[32, 64\]"),
    "attn_output [64, 96]": ({"blk.0.attn_output.weight": (64, 96)}, r"attn_output.weight has shape \[64, 96\]"),
    "ffn_down [64, 512]": ({"blk.1.ffn_down.weight": (64, 512)}, r"ffn_down.weight has shape \[64, 512\]"),
    "ffn_up [128, 64]": ({"blk.0.ffn_up.weight": (128, 64)}, r"ffn_up.weight has shape \[128, 64\]"),
    "attn_norm [32]": ({"blk.0.attn_norm.weight": (32,)}, r"attn_norm.weight has shape \[32\].* \[64\]"),
    "ffn_norm [2, 64]": ({"blk.1.ffn_norm.weight": (2, 64)}, r"ffn_norm.weight has shape \[2, 64\]"),
    "output [400, 64]": ({"output.weight": (400, 64)}, r"output.weight has shape \[400, 64\].* \[433, 64\]"),
    "token_embd [433, 96]": ({"token_embd.weight": (433, 96)}, r"token_embd.weight has shape \[433, 96\]"),
    "token_embd [400, 64]": ({"token_embd.weight": (400, 64)}, "token_embd.weight has 400 rows, but the vocabulary "
                             "has 433 tokens"),
}


@pytest.mark.parametrize("case", TENSOR_CASES)
def test_tensor_of_the_wrong_shape_is_one_clear_error(tmp_path, case):
    """Through rkc compile: exit 1, one line naming the tensor, its shape and the one it needs; no output file."""
    shapes, message = TENSOR_CASES[case]
    path = write_model(tmp_path / "m.gguf", "llama", tensor_shapes=shapes)
    r = CliRunner().invoke(rkc, ["compile", str(path), "-o", str(tmp_path / "m.rkbin")])
    assert r.exit_code == 1, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert re.search(message, lines[0]), lines[0]
    assert not (tmp_path / "m.rkbin").exists()
    print(f"{case}: {lines[0]}")


@pytest.mark.parametrize("case", CASES)
def test_hostile_hyperparameter_is_one_clear_error(llama, case):
    kv, n_vocab = llama
    key, value, message = CASES[case]
    with pytest.raises(FormatError, match=message) as info:
        config_from_gguf({**kv, key: value}, n_vocab, "m.gguf")
    assert "\n" not in str(info.value)
    print(f"{case}: {info.value}")


def test_the_good_file_passes(llama):
    kv, n_vocab = llama
    cfg = config_from_gguf(kv, n_vocab)
    assert (cfg.n_head, cfg.n_head_kv, cfg.n_layer) == (4, 2, 2)


def test_rkc_compile_exits_1(tmp_path, monkeypatch):
    """Through the CLI, on a file whose block_count is the string "two"."""
    monkeypatch.setattr(gguf.GGUFWriter, "add_block_count",
                        lambda self, n: self.add_string(f"{self.arch}.block_count", "two"))
    path = write_model(tmp_path / "m.gguf", "llama")
    r = CliRunner().invoke(rkc, ["compile", str(path), "-o", str(tmp_path / "m.rkbin")])
    assert r.exit_code == 1, r.output
    assert "llama.block_count is 'two', not an integer" in r.output
    assert not (tmp_path / "m.rkbin").exists()
