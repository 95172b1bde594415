"""rkc.load compiles every host kernel (numba) before the first request
(LlmEngine.warm_up): in a fresh process, a chat of two turns (every prefill
chunk program, a prefix reused, past the sliding window, decode, greedy
then sampled tokens with their logprobs) adds no
compiled signature to any of rkc's kernels; without the warm-up it does (so
the check can fail)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, sys
import numba
import rkc

def signatures():
    found = {}
    for name, mod in list(sys.modules.items()):
        if name.startswith("rkc."):
            for attr, v in vars(mod).items():
                if isinstance(v, numba.core.dispatcher.Dispatcher):
                    found[f"{name}.{attr}"] = len(v.signatures)
    return found

path, warm = sys.argv[1], sys.argv[2] == "1"
with rkc.load(path, device="null", warm_up=warm) as model:
    before = signatures()
    turn = [{"role": "user", "content": "the cat and the dog " * 6}]
    r = model.chat(turn, max_tokens=4, temperature=0, ignore_eos=True)
    turn += [{"role": "assistant", "content": r.text}, {"role": "user", "content": "hello world " * 3}]
    r2 = model.chat(turn, max_tokens=4, temperature=0.8, top_k=40, seed=0, logprobs=2, ignore_eos=True)
    assert r2.cached_tokens > 0
    after = signatures()
print(json.dumps({k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}))
"""


def _compiled_during_requests(rkbin, warm: bool) -> dict[str, int]:
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(rkbin), "1" if warm else "0"], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch,precision", [("gemma3", "int8"), ("qwen3", "fp16")])
def test_no_kernel_compiles_during_a_request(synth_rkbin, arch, precision):
    rkbin = synth_rkbin(arch, precision)
    assert _compiled_during_requests(rkbin, warm=True) == {}
    assert _compiled_during_requests(rkbin, warm=False)  # the check sees what a request compiles
