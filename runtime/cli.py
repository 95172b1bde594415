"""`rkrun`: run a compiled model."""

from __future__ import annotations

import sys

import click

from rkc.ir.cli_support import ErrorReportingCommand, debug_option
from rkc.ir.errors import RkcError
from rkc.runtime.devices import device_options
from rkc.runtime.serve.cli import serve


class RkrunCommand(ErrorReportingCommand):
    """`rkrun serve ...` is its own command (rkc.runtime.serve.cli); everything else is rkrun's."""

    def main(self, args=None, prog_name=None, **extra):
        args = list(sys.argv[1:] if args is None else args)
        if args[:1] == ["serve"]:
            return serve.main(args[1:], prog_name=f"{prog_name or 'rkrun'} serve", **extra)
        return super().main(args, prog_name=prog_name, **extra)


@click.command(cls=RkrunCommand, context_settings={"help_option_names": ["-h", "--help"]})
@debug_option
@click.version_option(package_name="rkc")
@click.option("--replay", "replay_case", metavar="CASE.json", type=click.Path(dir_okay=False),
              help="Replay a captured regcmd case on --device and compare with its reference.")
@click.argument("model", required=False, type=click.Path(dir_okay=False))
@click.option("--inputs", type=click.Path(dir_okay=False), help="Inputs (.npz keyed by the model's input names).")
@click.option("--outputs", type=click.Path(dir_okay=False), help="Write the outputs here (.npz keyed by name).")
@click.option("--fp16-outputs", is_flag=True,
              help="ONNX: outputs the NPU computed in fp16 come back as float16 (no widening to float32).")
@device_options
@click.option("-p", "--prompt", help="LLM: the prompt to continue.")
@click.option("-n", "--n-predict", default=64, show_default=True, help="LLM: tokens to generate.")
@click.option("--temp", "temperature", default=0.8, show_default=True, help="LLM: temperature (0 = greedy).")
@click.option("--top-k", default=40, show_default=True, help="LLM: sample among the k most likely (0 = all).")
@click.option("--top-p", default=0.95, show_default=True, help="LLM: nucleus sampling threshold.")
@click.option("--seed", type=int, default=None, help="LLM: random seed for sampling.")
@click.option("--ctx", type=int, default=None, help="LLM: context size (default: the model's; 512 for perplexity).")
@click.option("--perplexity", type=click.Path(dir_okay=False, exists=True), help="LLM: score a text file.")
@click.option("--logits", type=click.Path(dir_okay=False),
              help="LLM: write the teacher-forced logits of --text here (.npy, float32 [N, vocab]; row i predicts "
                   "token i + 1, windows of --ctx cut as --perplexity cuts them).")
@click.option("--text", type=click.Path(dir_okay=False, exists=True), help="LLM: the text file --logits scores.")
@click.option("--tokenize", help="LLM: print the token ids of TEXT (BOS first).")
@click.option("--chat", is_flag=True, help="LLM: wrap the prompt in the model's chat template.")
@click.option("--ignore-eos", is_flag=True, help="LLM: generate all -n tokens, whatever the logits say.")
def main(model: str | None, replay_case: str | None, inputs: str | None, outputs: str | None, fp16_outputs: bool,
         device: str, cores: int, **llm) -> None:
    """Run MODEL (an .rkbin made by `rkc compile`) on the NPU or its simulator.

    \b
    rkrun model.rkbin --inputs in.npz --outputs out.npz   # an ONNX model
    rkrun model.rkbin -p "Hello" -n 64                    # an LLM: generate text
    rkrun model.rkbin --perplexity wiki.txt --ctx 256     # an LLM: perplexity
    rkrun model.rkbin --logits l.npy --text wiki.txt      # an LLM: teacher-forced logits
    rkrun model.rkbin --tokenize "Hello"                  # an LLM: token ids
    rkrun --replay CASE.json --device rocket              # replay a captured regcmd case
    rkrun serve model.rkbin --port 8080                   # an LLM: OpenAI-compatible HTTP API
    """
    # Each path imports only what it runs (the replay, the rkbin reader, the LLM or the ONNX runner): `rkrun --help`
    # loads none of them.
    if replay_case is not None:
        from rkc.runtime.replay import run_cli

        raise SystemExit(run_cli(replay_case, device, cores))
    if model is None:
        raise RkcError("no model given (see rkrun --help)")
    from rkc.ir.rkbin import read_rkbin

    rk = read_rkbin(model)
    if rk.module.metadata.get("model_kind") == "llm":
        from rkc.runtime.llm.cli import LlmRunOptions, run_llm

        run_llm(rk, LlmRunOptions(**llm), device, cores)
        return
    from rkc.runtime.run_cli import run_once

    run_once(model, inputs, outputs, device, cores, fp16_outputs)
