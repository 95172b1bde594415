"""A chat's next turn reuses the cached prefix, whatever plan ran the last
one, on a model whose sliding window (gemma3 synth: 6) is shorter than the
padded run of the plan by the NPU's figures (generate.chunk_plan), and when
the next prompt leaves the cache a few positions before its end (a reply
that does not read back as the same tokens: the KV cache holds ROLLBACK
positions before a window layer's live ones)."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.runtime.llm.engine import LlmEngine
from rkc.runtime.llm.generate import Generator, Sampler, chunk_plan

PROMPT = 21  # by the NPU's figures: 16 + 5 padded in a 16 (11 pad rows, past the window of 6)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_next_turn_reuses_the_prefix_and_gives_a_fresh_runs_logits(synth_rkbin, precision):
    engine = LlmEngine(synth_rkbin("gemma3", precision, (1, 4, 16)))
    window = min(w for w in engine.cfg.cache_windows() if w)
    plan = chunk_plan(PROMPT, engine.chunks, engine.npu_seconds(all_logits=False))
    assert any(c - n > window for c, n in plan)  # a padded run longer than the window
    rng = np.random.default_rng(7)
    first = [engine.tokenizer.bos_id, *rng.integers(3, engine.cfg.n_vocab, PROMPT - 1).tolist()]
    gen = Generator(engine, 64)
    reply = list(gen.generate(first, 4, Sampler(0.0), stop_at_eos=False))
    assert gen.cache.length == PROMPT + len(reply) - 1  # (the last token was never run)
    # the next prompt leaves the reply (3 cached positions, so the window layers' live keys no longer
    # reach back to the prompt's last ones) for other tokens
    second = first + rng.integers(3, engine.cfg.n_vocab, 9).tolist()
    list(gen.generate(second, 1, Sampler(0.0), stop_at_eos=False, reuse=PROMPT))
    assert gen.timings.cached_tokens == PROMPT and gen.timings.prompt_tokens == len(second) - PROMPT
    # the reused cache's logits for the rest, every row, against a fresh run of the whole prompt
    assert gen.cache.truncate(PROMPT)
    got = gen._forward(second[PROMPT:], PROMPT, all_logits=True)
    fresh = Generator(engine, 64)
    want = fresh._forward(second, 0, all_logits=True)[PROMPT:]
    # only float rounding differs (as test_chunking_does_not_change_the_numbers allows: other chunks)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=2e-2)
