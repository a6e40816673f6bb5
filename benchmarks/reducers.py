"""Thread CPU of each reducer's looks, over the whole frame cut in a flow's batches, in one process.

    flock /tmp/nsysan-bench.lock python benchmarks/reducers.py benchmarks/data/big_1e7.sqlite \\
        [--rows 262144] [--repeat 3] [--only Spikes,SiteRanks]

Run it once per checkout (PYTHONPATH=checkout) and compare the columns. The export is analyzed
once (the whole frame, its frames kept); then each reducer of every engine run of that analysis
is started again with the facts that run gave it and fed the frame cut in batches of --rows events
(engine.FramePieces, 2^18: the flow's batch), add, between, again and finish timed alone on this
thread (time.thread_time: what a loaded machine's other processes take is not counted, unlike
ab.py's wall times). Each batch's (process, device, kind) groups are made before each look and not
timed, as a flow's are made once for every reducer (the first reducer asking pays them there). The
least of --repeat runs is printed, per reducer and look.
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import nsysan
from nsysan import analyses, engine
from nsysan.analyses.groups import batch_groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export", type=Path)
    parser.add_argument("--rows", type=int, default=1 << 18)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="reducer class names, comma-separated (default: all)")
    args = parser.parse_args()
    runs, frames = _analyzed(args.export)
    pieces = engine.FramePieces(frames["events"], args.rows)
    batches = [pieces[i] for i in range(len(pieces))]
    live = engine.frame_live(frames["events"])
    wanted = set(filter(None, args.only.split(",")))
    for reducers, facts in runs:
        for reducer in reducers:
            name = type(reducer).__name__
            if wanted and name not in wanted:
                continue
            best = {look: min(times) for look, times in _timed(reducer, facts, batches, live, args.repeat).items()}
            print(f"{name:22s} " + "  ".join(f"{look} {seconds:.3f}" for look, seconds in best.items()), flush=True)


def _analyzed(export: Path) -> tuple[list, dict]:
    """The analysis of `export` (whole frame), recording each engine run's reducers and facts and the frame."""
    runs, frames = [], {}
    made, cut = engine.Engine.__init__, engine.FramePieces.__init__

    def recorded(self, reducers, facts):
        reducers = list(reducers)
        runs.append((reducers, facts))
        made(self, reducers, facts)

    def kept(self, events, rows):
        frames["events"] = events
        cut(self, events, rows)

    engine.Engine.__init__, engine.FramePieces.__init__ = recorded, kept
    analyses.FramePieces = engine.FramePieces
    try:
        nsysan.analyze(export, keep_events=True)
    finally:
        engine.Engine.__init__, engine.FramePieces.__init__ = made, cut
    return runs, frames


def _timed(reducer, facts, batches: list, live: dict, repeat: int) -> dict[str, list[float]]:
    """Thread CPU seconds of each look of a copy of `reducer`, started again, over `batches`."""
    times: dict[str, list[float]] = {"add": [], "between": [], "again": [], "finish": []}
    for _ in range(repeat):
        again = copy.copy(reducer)
        again.start(facts)
        _grouped(batches)
        times["add"].append(_cpu(lambda: [again.add(b) for b in batches]))
        if again.second_look:
            times["between"].append(_cpu(again.between))
            _grouped(batches)
            times["again"].append(_cpu(lambda: [again.again(b) for b in batches]))
        times["finish"].append(_cpu(lambda: again.finish(dict(live))))
    return {look: spent for look, spent in times.items() if spent}


def _grouped(batches: list) -> None:
    """Each batch's per-batch work made afresh, its groups made (untimed), as a flow's look finds them."""
    for b in batches:
        b.shared = {}
        batch_groups(b)


def _cpu(work) -> float:
    start = time.thread_time()
    work()
    return time.thread_time() - start


if __name__ == "__main__":
    main()
