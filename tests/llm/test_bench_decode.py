"""bench/llm.py's decode timing with the positions interleaved
(decode_interleaved): every position gets its tokens at its own positions, a
block of each a round, so load drifting over the run weighs on every
position's figure alike."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from rkc.runtime.llm.engine import LlmEngine

BENCH_LLM = Path(__file__).resolve().parents[2] / "bench" / "llm.py"


def _bench():
    # under another name: bench/llm.py would shadow the tests' llm package
    spec = importlib.util.spec_from_file_location("rkc_bench_llm_decode", BENCH_LLM)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_decode_interleaved_runs_every_position_in_rotated_blocks(synth_rkbin, monkeypatch):
    bench = _bench()
    engine = LlmEngine(synth_rkbin("gemma3", "int8"), device="null")
    seen = []  # the position of every decode run, in order
    run = engine.run

    def recording(program, tokens, positions, cache):
        if program == "decode":
            seen.append(int(positions[0]))
        return run(program, tokens, positions, cache)
    monkeypatch.setattr(engine, "run", recording)
    caches, new_cache = [], engine.new_cache
    monkeypatch.setattr(engine, "new_cache", lambda n: caches.append(new_cache(n)) or caches[-1])
    monkeypatch.setattr(bench, "PROMPT_TOKEN", 5)  # (Gemma 3's token 1000: past the tiny model's vocabulary)

    positions, block = [3, 9, 20], bench.DECODE_BLOCK
    tokens = 2 * block + 1  # (a last round shorter than a block)
    try:
        out = bench.decode_interleaved(engine, positions, tokens)
    finally:
        engine.close()

    assert sorted(out) == ["20", "3", "9"] and all(v > 0 for v in out.values())
    setup, timed = seen[:-tokens * len(positions)], seen[-tokens * len(positions):]
    assert all(s in setup for s in positions)  # each position's untimed token first
    # then rounds of every position's next tokens (start + i ..), a block of each back to back, orders rotated
    firsts, i = set(), 0
    while timed:
        n = min(block, tokens - i)
        blocks = [timed[j:j + n] for j in range(0, n * len(positions), n)]
        starts = [b[0] - i for b in blocks]
        assert sorted(starts) == positions
        assert all(b == [s + i + j for j in range(n)] for b, s in zip(blocks, starts))
        firsts.add(starts[0])
        timed, i = timed[n * len(positions):], i + n
    assert i == tokens and len(firsts) > 1  # no position first in every round
    # each cache holds its positions once: the warm-up's token taken back before the timed ones
    for start, cache in zip(positions, caches):
        assert list(cache.pos[cache.windows.index(0)]) == list(range(start + tokens))  # (a global layer's)
