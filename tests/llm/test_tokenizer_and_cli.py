"""Tokenizers built from GGUF vocabularies, and the rkrun LLM command line."""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

from llm import llamacpp
from llm.conftest import ARCHS
from rkc.runtime.cli import main as rkrun
from rkc.runtime.llm.engine import LlmEngine
from rkc.runtime.llm.generate import Generator
from rkc.runtime.llm.tokenizer import LlmTokenizer, TextStream

TEXTS = ["hello world the", " the cat and the dog", "Hello, world! 123 ünï 東京", "time\n\nrun  ing\tx",
         "thethethe hellohello", "", " ", "it's we'll THEY'RE 12345 ...!!", "<start_of_turn>user"]


@pytest.mark.parametrize("arch", ARCHS)
def test_round_trip(arch, synth_gguf):
    tok = LlmTokenizer.from_gguf(str(synth_gguf(arch)))
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids[:1] == [tok.bos_id]
        assert tok.decode(ids) == text


@pytest.mark.parametrize("arch", ARCHS)
def test_tokens_equal_llama_cpp(arch, synth_gguf):
    model = llamacpp.load(str(synth_gguf(arch)), n_ctx=64)
    tok = LlmTokenizer.from_gguf(str(synth_gguf(arch)))
    for text in TEXTS:
        assert tok.encode(text) == llamacpp.tokenize(model, text), repr(text)


def test_spm_tokens_by_hand(synth_gguf):
    """gemma3-style SPM (no space prefix): whole words where the vocabulary has them,
    bytes for what it lacks."""
    tok = LlmTokenizer.from_gguf(str(synth_gguf("gemma3")))
    pieces = [tok.hf.id_to_token(i) for i in tok.encode("hello world!")[1:]]
    assert pieces == ["hello", "\u2581world", "<0x21>"]


def test_stream_holds_back_partial_characters(synth_gguf):
    tok = LlmTokenizer.from_gguf(str(synth_gguf("gemma3")))
    ids = tok.encode("東 x", add_bos=False)  # 東 is three byte tokens
    stream = TextStream(tok)
    pieces = [stream.push(i) for i in ids]
    assert pieces[:2] == ["", ""] and "".join(pieces) == "東 x"


def test_rkrun_tokenize(synth_rkbin):
    path = synth_rkbin("llama")
    r = CliRunner().invoke(rkrun, [str(path), "--tokenize", "the cat"])
    assert r.exit_code == 0, r.output
    ids = LlmEngine(path).tokenizer.encode("the cat")
    assert r.output == " ".join(map(str, ids)) + "\n"


def test_rkrun_generates_greedily(synth_rkbin):
    path = synth_rkbin("qwen3")
    r1 = CliRunner().invoke(rkrun, [str(path), "-p", "the cat", "-n", "6", "--temp", "0"])
    r2 = CliRunner().invoke(rkrun, [str(path), "-p", "the cat", "-n", "6", "--temp", "0"])
    assert r1.exit_code == 0, r1.output
    assert r1.stdout == r2.stdout and r1.stdout.strip()
    assert "decode:" in r1.stderr and "prefill:" in r1.stderr


def test_rkrun_perplexity_last_line(synth_rkbin, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the cat and the dog run in the world at one time. " * 4)
    r = CliRunner().invoke(rkrun, [str(synth_rkbin("gemma3")), "--perplexity", str(text), "--ctx", "16"])
    assert r.exit_code == 0, r.output
    last = r.stdout.strip().splitlines()[-1]
    n = len(LlmEngine(synth_rkbin("gemma3")).tokenizer.encode(text.read_text())) - 1
    assert last.startswith("perplexity: ") and last.endswith(f" over {n} tokens")


def test_rkrun_logits_are_the_perplexity_windows(synth_rkbin, tmp_path):
    """--logits: float32 [N, vocab], N the count --perplexity reports, row i the
    logits predicting token i + 1 of the windows --perplexity cuts (so they give
    its perplexity back), each row what the engine computes for that window."""
    text = tmp_path / "t.txt"
    text.write_text("the cat and the dog run in the world at one time. " * 4)
    out = tmp_path / "l.npy"
    path = str(synth_rkbin("gemma3"))
    r = CliRunner().invoke(rkrun, [path, "--logits", str(out), "--text", str(text), "--ctx", "16",
                                   "--perplexity", str(text)])
    assert r.exit_code == 0, r.output
    last = r.stdout.strip().splitlines()[-1].split()
    ppl, n = float(last[1]), int(last[3])
    logits = np.load(out)
    engine = LlmEngine(path)
    tokens = engine.tokenizer.encode(text.read_text())
    assert logits.dtype == np.float32 and logits.shape == (n, engine.cfg.n_vocab) and n == len(tokens) - 1
    windows = Generator.windows(tokens, 16)
    assert len(windows) > 2 and all(w[0] == tokens[0] for w in windows)
    targets = np.concatenate([w[1:] for w in windows])
    logp = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    assert np.exp(-logp[np.arange(n), targets].mean()) == pytest.approx(ppl, rel=1e-4)
    gen = Generator(engine, 17)
    second = gen._forward(windows[1][:-1], 0, all_logits=True)
    np.testing.assert_array_equal(logits[len(windows[0]) - 1:][:len(second)], second)


def test_rkrun_logits_needs_text(synth_rkbin, tmp_path):
    r = CliRunner().invoke(rkrun, [str(synth_rkbin("gemma3")), "--logits", str(tmp_path / "l.npy")])
    assert r.exit_code == 1 and "--text" in r.output and r.output.strip().count("\n") == 0
    assert not (tmp_path / "l.npy").exists()


def test_rkrun_llm_without_prompt_is_one_line(synth_rkbin):
    r = CliRunner().invoke(rkrun, [str(synth_rkbin("llama"))])
    assert r.exit_code == 1
    assert r.output.strip().count("\n") == 0 and "needs -p PROMPT" in r.output


def test_rkrun_null_device_ignore_eos_runs_to_n(synth_rkbin):
    """--device null measures the host alone; --ignore-eos makes the run as long as -n says."""
    r = CliRunner().invoke(rkrun, [str(synth_rkbin("gemma3")), "-p", "the cat", "-n", "9", "--temp", "0",
                                   "--device", "null", "--ignore-eos"])
    assert r.exit_code == 0, r.output
    assert re.search(r"^decode: 9 tokens in [0-9.]+ s \([0-9.]+ t/s\)$", r.stderr, re.M), r.stderr
