"""Built-in chat templates (runtime/api/chat_templates): each family's
rendering of a two-turn conversation against its documented format (the exact
text, written out here from the families' own docs), the choice from the
architecture and the vocabulary, and a chat on GGUFs that carry no template."""

from __future__ import annotations

import pytest

from rkc.runtime.api import chat_templates
from rkc.runtime.api.llm import render_chat

SYSTEM = {"role": "system", "content": "Be brief."}
TWO_TURNS = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": "What is 2+2?"}]

EXPECTED = {
    # ai.google.dev/gemma/docs/formatting: no system role, its text opens the first user turn
    "gemma": ("<start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n"
              "<start_of_turn>model\nHello!<end_of_turn>\n"
              "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n"
              "<start_of_turn>model\n"),
    # ai.google.dev/gemma/docs/core/prompt-formatting-gemma4
    "gemma4": ("<|turn>system\nBe brief.<turn|>\n"
               "<|turn>user\nHi there<turn|>\n"
               "<|turn>model\nHello!<turn|>\n"
               "<|turn>user\nWhat is 2+2?<turn|>\n"
               "<|turn>model\n"),
    # Meta's Llama 3 model card, prompt format (<|begin_of_text|> is the tokenizer's BOS)
    "llama3": ("<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    # ChatML (Qwen2/Qwen3 model cards)
    "chatml": ("<|im_start|>system\nBe brief.<|im_end|>\n"
               "<|im_start|>user\nHi there<|im_end|>\n"
               "<|im_start|>assistant\nHello!<|im_end|>\n"
               "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
               "<|im_start|>assistant\n"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_family_renders_its_documented_format(name):
    assert render_chat(chat_templates.text(name), [SYSTEM, *TWO_TURNS]) == EXPECTED[name]


def test_every_family_has_a_template_and_an_expectation():
    assert {f.template for f in chat_templates.FAMILIES} | {chat_templates.FALLBACK} == set(EXPECTED)


def test_gemma_without_system_and_a_system_message_later_on():
    text = chat_templates.text("gemma")
    assert render_chat(text, TWO_TURNS) == EXPECTED["gemma"].replace("Be brief.\n\n", "")
    late = [*TWO_TURNS[:2], SYSTEM, TWO_TURNS[2]]  # the system text opens the next user turn
    assert "<start_of_turn>user\nBe brief.\n\nWhat is 2+2?<end_of_turn>" in render_chat(text, late)


GEMMA3_VOCAB = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
GEMMA4_VOCAB = ["<bos>", "<|turn>", "<turn|>", "<start_of_turn>"]
LLAMA3_VOCAB = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CHATML_VOCAB = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.mark.parametrize("arch,vocab,expected", [
    ("gemma3", GEMMA3_VOCAB, "gemma"),
    ("gemma", GEMMA3_VOCAB, "gemma"),
    ("gemma4", GEMMA4_VOCAB, "gemma4"),
    ("llama", LLAMA3_VOCAB, "llama3"),
    ("qwen2", CHATML_VOCAB, "chatml"),
    ("qwen3", CHATML_VOCAB + LLAMA3_VOCAB, "chatml"),  # the architecture decides between fitting families
    ("llama", CHATML_VOCAB + LLAMA3_VOCAB, "llama3"),
    ("llama", CHATML_VOCAB, "chatml"),  # a llama fine-tune speaking ChatML
    ("gemma3", ["<bos>", "<eos>"], "chatml"),  # the markers are missing: the last resort
    ("llama", ["<s>", "</s>"], "chatml"),  # Llama 2: no family of ours
    ("mystery", [], "chatml"),
])
def test_choice_from_architecture_and_vocabulary(arch, vocab, expected):
    assert chat_templates.choose(arch, vocab) == expected


@pytest.mark.parametrize("arch,source", [("gemma3", "builtin:gemma"), ("qwen3", "builtin:chatml"),
                                         ("llama", "builtin:gemma")])
def test_a_gguf_without_template_chats(synth_rkbin, arch, source):
    """The synthetic GGUFs carry no template; the SentencePiece vocabularies (gemma3's, llama's) hold
    <start_of_turn> (tests/llm/synth.py), qwen3's <|im_start|>: the markers decide."""
    import rkc

    with rkc.load(synth_rkbin(arch), device="null") as model:
        assert model.chat_template_source == source
        r = model.chat([SYSTEM, *TWO_TURNS], max_tokens=3, temperature=0, ignore_eos=True)
        assert r.completion_tokens == 3
        expected = EXPECTED[source.split(":")[1]]
        assert r.prompt_tokens == len(model.tokenizer.encode(expected, special=True))


def test_the_caller_and_the_gguf_template_come_first(synth_rkbin, tiny_chat_rkbin):
    import rkc

    custom = "{% for m in messages %}{{ m['content'] }}|{% endfor %}"
    with rkc.load(synth_rkbin("gemma3"), device="null", chat_template=custom) as model:
        assert model.chat_template_source == "custom"
        assert model.encode_chat(TWO_TURNS) == model.tokenizer.encode("Hi there|Hello!|What is 2+2?|")
    with rkc.load(tiny_chat_rkbin, device="null") as model:  # its GGUF has one
        assert model.chat_template_source == "gguf"


def test_rkrun_chat_on_a_gguf_without_template(synth_rkbin):
    from click.testing import CliRunner

    from rkc.runtime.cli import main as rkrun

    r = CliRunner().invoke(rkrun, [str(synth_rkbin("gemma3")), "-p", "the cat", "--chat", "-n", "3", "--temp", "0",
                                   "--device", "null", "--ignore-eos"])
    assert r.exit_code == 0, r.output
    assert "chat template: builtin:gemma" in r.stderr
