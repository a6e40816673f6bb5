"""The whole events frame fed to the reducers in pieces (engine.FramePieces, as run_analyses feeds
it): the batches are those of `pieces(frame_batch(events), ...)`, made afresh on every read, and
the document of an analysis whose frame is cut in pieces is the one of a single batch; the
command line's analysis lets the calls frame go."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from conftest import FIXTURES

import nsysan
import nsysan.analyses as analyses
import nsysan.pipeline.stages as stages
from nsysan.engine import FramePieces, frame_batch, pieces
from nsysan.events.batch import LIVE_COLUMNS
from nsysan.render.json import render_json

COLUMNS = ("seq", "ts", "pid", "device", "kind", "is_alloc", "address", "bytes", "delta", "pool", "partner_seq",
           "correlation")


def same_batch(made, cut) -> bool:
    return (all(np.array_equal(getattr(made, c), getattr(cut, c)) for c in COLUMNS)
            and made.calls.keys() == cut.calls.keys()
            and all(np.array_equal(made.calls[k], cut.calls[k]) for k in cut.calls)
            and all(np.array_equal(made.live_before[k], cut.live_before[k]) for k in LIVE_COLUMNS)
            and not made.closed and not made.shared)


@pytest.mark.parametrize("name, rows", [("ddp_leak_v25", 3), ("ddp_leak_v25", 1000), ("known_mem_v25", 52),
                                        ("known_mem_v25", 100)])
def test_pieces_are_the_frames_batches_cut_every_rows(name, rows):
    events = nsysan.analyze(FIXTURES / f"{name}.sqlite", keep_events=True).events
    made = FramePieces(events, rows)
    cut = pieces(frame_batch(events), range(rows, len(events), rows))
    assert len(made) == len(cut) == -(-len(events) // rows)
    assert all(same_batch(m, c) for m, c in zip(made, cut))
    # each read makes its batches again: what one engine run keeps of a batch is not another's
    assert made[0] is not made[0] and made[0].seq[0] == 0 and made[len(made) - 1].seq[-1] == len(events) - 1
    assert sum(len(b) for b in made) == len(events)
    # ddp_leak's second rank allocates while the first's allocations are live: carried between pieces
    if rows == 3:
        assert max(len(b.live_before["seq"]) for b in made) > 0


def test_no_events_are_one_empty_piece():
    events = nsysan.analyze(FIXTURES / "known_mem_v25.sqlite", keep_events=True).events.iloc[:0]
    made = FramePieces(events, 4)
    assert len(made) == 1 and len(made[0]) == 0 and same_batch(made[0], pieces(frame_batch(events), [])[0])


@pytest.mark.parametrize("name", ["known_mem_v25", "real_oom_v25", "torch_async_v25", "torch_oom_v25",
                                  "torch_expandable_v25"])
def test_the_document_is_the_same_when_the_frame_is_fed_in_pieces(name, monkeypatch):
    """About 7 pieces (the command line's are 2^20 events: a fixture is one), every reducer run
    over them (the peaks and the timeline on the second core), against the single batch's."""
    whole = nsysan.analyze(FIXTURES / f"{name}.sqlite", keep_events=True)
    monkeypatch.setattr(analyses, "PIECE_ROWS", max(1, len(whole.events) // 7))
    cut = nsysan.analyze(FIXTURES / f"{name}.sqlite", keep_events=True)
    assert render_json(cut) == render_json(whole)
    assert len(FramePieces(whole.events, analyses.PIECE_ROWS)) >= 7


@pytest.mark.parametrize("name", ["known_mem_v25", "real_oom_v25"])
def test_the_command_lines_analysis_lets_the_calls_frame_go(name, monkeypatch):
    """Without frames kept (the command line's), run_analyses is the calls frame's last holder and
    lets it go once read (real_oom has a failed call: the verdicts read the calls again, and the
    frame goes with them, at the collection of their cycle of references); the document is the
    one of an analysis that keeps its frames."""
    seen = {}
    analyses_of = stages.run_analyses

    def run_analyses(loaded, *rest, **options):
        calls = weakref.ref(loaded.calls)
        seen["calls"] = len(loaded.calls)
        analysis = analyses_of(loaded, *rest, **options)
        if name == "real_oom_v25":
            gc.collect()
        seen["held"] = calls() is not None or not loaded.calls.empty
        return analysis

    monkeypatch.setattr(stages, "run_analyses", run_analyses)
    kept = nsysan.analyze(FIXTURES / f"{name}.sqlite", keep_events=True)
    assert seen["held"] and kept.calls is not None and len(kept.calls) == seen["calls"] > 0
    let_go = nsysan.analyze(FIXTURES / f"{name}.sqlite", keep_events=False)
    assert not seen["held"] and let_go.calls is None
    assert render_json(let_go) == render_json(kept)
    assert (name == "real_oom_v25") == bool(let_go.failed_calls)
