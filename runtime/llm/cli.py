"""What `rkrun` does with an LLM rkbin: generate, score (perplexity) or tokenize."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

from rkc.ir.errors import RkcError
from rkc.ir.rkbin import Rkbin


@dataclass
class LlmRunOptions:
    prompt: str | None = None
    n_predict: int = 64
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    seed: int | None = None
    ctx: int | None = None
    perplexity: str | None = None
    logits: str | None = None  # with text: write its teacher-forced logits
    text: str | None = None
    tokenize: str | None = None
    chat: bool = False
    ignore_eos: bool = False


def run_llm(rk: Rkbin, o: LlmRunOptions, device: str = "auto", cores: int = 3) -> None:
    # deferred: the engine (numba, the devices) and the tokenizer (tokenizers) load when an LLM runs, not for --help
    from rkc.runtime.api.llm import LlmModel
    from rkc.runtime.llm.engine import LlmEngine
    from rkc.runtime.llm.generate import Generator

    if o.tokenize is not None:  # needs no device
        from rkc.runtime.llm.tokenizer import LlmTokenizer

        if "tokenizer" not in rk.blobs:
            raise RkcError(f"{rk.path}: LLM rkbin without a tokenizer")
        tok = LlmTokenizer.from_json(bytes(rk.blobs["tokenizer"]).decode())
        click.echo(" ".join(str(i) for i in tok.encode(o.tokenize)))
        return
    if (o.logits is None) != (o.text is None):
        raise RkcError("--logits OUT.npy and --text FILE go together")
    if o.prompt is None and o.perplexity is None and o.logits is None:
        raise RkcError("an LLM needs -p PROMPT, --perplexity FILE, --logits OUT.npy --text FILE or --tokenize TEXT")
    t0 = time.perf_counter()
    engine = LlmEngine(rk, device, cores)
    tok = engine.tokenizer
    if o.perplexity is None and o.logits is None:  # generation: its kernels compiled before the first token
        engine.warm_up(on_compile=lambda: click.echo("rkrun: compiling host kernels (first run only)...", err=True))
    load_s = time.perf_counter() - t0
    ctx = o.ctx or 512

    def scored(path: str) -> tuple[Generator, list[int]]:
        ids = tok.encode(Path(path).read_text(encoding="utf-8"), add_bos=True)
        if ids[0] != tok.bos_id:
            raise RkcError("the model has no BOS token; perplexity windows start with one")
        return Generator(engine, ctx + 1), ids

    if o.logits is not None:
        gen, ids = scored(o.text)
        t1 = time.perf_counter()
        n = gen.write_logits(ids, ctx, o.logits, progress=lambda i, k: click.echo(f"[{i}/{k}]", err=True, nl=False))
        click.echo("", err=True)
        click.echo(f"wrote {o.logits}: logits of {n} tokens x {engine.cfg.n_vocab} in "
                   f"{time.perf_counter() - t1:.1f} s, windows of {ctx}", err=True)
    if o.perplexity is not None:
        gen, ids = scored(o.perplexity)
        t1 = time.perf_counter()
        ppl, n = gen.perplexity(ids, ctx, progress=lambda i, k: click.echo(f"[{i}/{k}]", err=True, nl=False))
        dt = time.perf_counter() - t1
        click.echo("", err=True)
        click.echo(f"scored {n} tokens in {dt:.1f} s ({n / dt:.1f} t/s), windows of {ctx}", err=True)
        click.echo(f"perplexity: {ppl:.4f} over {n} tokens")
    if o.perplexity is not None or o.logits is not None:
        return
    llm = LlmModel(engine, o.ctx, cache_slots=1)
    sampling = dict(max_tokens=o.n_predict, temperature=o.temperature, top_p=o.top_p, top_k=o.top_k, seed=o.seed,
                    stream=True, ignore_eos=o.ignore_eos)
    if o.chat:
        stream = llm.chat([{"role": "user", "content": o.prompt}], **sampling)
    else:
        stream = llm.generate(o.prompt, **sampling)
    for piece in stream:
        click.echo(piece, nl=False)  # echo flushes: the text streams as it comes
    click.echo("")
    sys.stdout.flush()
    click.echo(f"load: {load_s:.2f} s; placement: prefill {engine.placement.get('prefill')}, "
               f"decode {engine.placement.get('decode')}", err=True)
    if o.chat:
        click.echo(f"chat template: {llm.chat_template_source}", err=True)
    for line in llm.timings.lines():
        click.echo(line, err=True)
