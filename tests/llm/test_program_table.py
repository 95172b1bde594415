"""The programs of an LLM rkbin: named once (ir/llm.py), written into the
metadata by the compiler, chosen from that table by the runtime."""

import pytest

from rkc.ir.errors import FormatError
from rkc.ir.llm import DECODE, LlmProgram, choose_program, program_plan, programs_in
from rkc.ir.rkbin import read_rkbin
from rkc.runtime.llm.engine import LlmEngine


def test_the_plan_is_decode_then_prefill_and_score_per_chunk():
    assert [(p.name, p.rows, p.last_row_only) for p in program_plan([16, 1, 4])] == [
        (DECODE, 1, False), ("prefill_4", 4, True), ("score_4", 4, False),
        ("prefill_16", 16, True), ("score_16", 16, False)]


def test_choosing_by_rows_and_logits():
    table = {p.name: p for p in program_plan([1, 8])}
    assert choose_program(table, 8, all_logits=False).name == "prefill_8"
    assert choose_program(table, 8, all_logits=True).name == "score_8"
    assert choose_program(table, 1, all_logits=True).name == choose_program(table, 1, False).name == DECODE
    with pytest.raises(FormatError, match="no 4-token program"):
        choose_program(table, 4, all_logits=False)


@pytest.mark.parametrize("metadata", [{}, {"programs": []}, {"programs": {"decode": {"rows": 1}}},
                                      {"programs": {"prefill_4": {"rows": 4, "last_row_only": True}}},
                                      {"programs": {"decode": {"rows": 1, "last_row_only": False,
                                                               "modelled_npu_s": "soon"}}}])
def test_a_missing_or_broken_table_is_a_format_error(metadata):
    with pytest.raises(FormatError, match="m.rkbin: LLM rkbin without"):
        programs_in(metadata, "m.rkbin")


def test_the_compiler_writes_the_table_the_runtime_reads(synth_rkbin):
    path = synth_rkbin("llama", chunks=(1, 4))
    module = read_rkbin(path).module
    table = programs_in(module.metadata)
    assert table == {p.name: p for p in program_plan([1, 4])}
    assert all(p.npu_s > 0 for p in table.values())  # each run's modelled NPU time, for the chunk plan
    assert [p.name for p in module.programs] == list(p.name for p in program_plan([1, 4]))
    engine = LlmEngine(path, device="sim")
    try:
        for p in table.values():  # every program's token input has the rows the table states
            assert engine.model.tensors[p.tensor("tokens")].shape[0] == p.rows
        assert engine.program_for(4, all_logits=True) == LlmProgram("score_4", 4, False)
        assert engine.npu_seconds(all_logits=False) == {1: table[DECODE].npu_s, 4: table["prefill_4"].npu_s}
    finally:
        engine.close()
