"""docs/hardware-questions.md mirrors runtime/sim/quirks.py: every open question,
its sources and the simulator's reading, word for word."""

from pathlib import Path

from rkc.runtime.sim.quirks import DEFAULT, QUESTIONS

DOC = Path(__file__).resolve().parents[2] / "docs" / "hardware-questions.md"


def test_every_question_is_documented_verbatim():
    text = DOC.read_text()
    for q in QUESTIONS:
        assert f"## {q.id}: {q.title}" in text, q.id
        assert q.sources in text and q.reading in text, q.id
    assert len({q.id for q in QUESTIONS}) == len(QUESTIONS)


def test_defaults_are_the_rejecting_readings():
    assert DEFAULT.chained_integer_tasks == "reject" and DEFAULT.ew_int32 == "reject"
    assert DEFAULT.flying_erdma == "reject" and DEFAULT.min_feature_rows == 4
    assert DEFAULT.completion_blocks == ("DPU",) and DEFAULT.ppu_precisions == (2,)
