"""Where the memory of one analysis goes: resident memory per stage, and the frames' columns.

    flock /tmp/nsysan-bench.lock python benchmarks/memory_stages.py benchmarks/data/big_1e7.sqlite

Runs the pipeline of `nsysan analyze FILE --format json` in this process, with the command line's
allocator settings, and prints per stage (the loading's progress stages, the analyses, the JSON)
the highest resident memory during it (the kernel's high-water mark, reset as each stage begins;
where it can't be, the highest of samples taken every 20 ms) and the memory held when it ended;
then the bytes of each column of the frames the
analysis keeps (`events`, `calls`, `nvtx_ranges`).
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path


def resident_mib(field: str = "VmRSS") -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def reset_high_water_mark() -> bool:
    """Start the kernel's peak resident memory (VmHWM) again from the current one (Linux 4.0+)."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


class Sampler:
    """The highest resident memory per stage, sampled on a thread."""

    def __init__(self) -> None:
        self.stage, self.began = "start-up", time.perf_counter()
        self.rows: list[list] = []  # stage, seconds, peak MiB, MiB at its end
        self.peak = resident_mib()
        self.exact = reset_high_water_mark()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, resident_mib())

    def enter(self, stage: str) -> None:
        now = resident_mib()
        # the kernel's exact peak since the last stage began, where it can be reset; else the samples'
        self.peak = max(self.peak, now, resident_mib("VmHWM") if self.exact else 0.0)
        self.rows.append([self.stage, time.perf_counter() - self.began, self.peak, now])
        self.exact = reset_high_water_mark()
        self.stage, self.began, self.peak = stage, time.perf_counter(), now

    def stop(self) -> None:
        self.enter("")
        self._stop.set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--library", action="store_true", help="without the command line's allocator settings")
    args = parser.parse_args()

    from nsysan.runtime import malloc_tuning
    from nsysan.analyses import run_analyses as analyses_of
    import nsysan.pipeline.stages as pipeline
    from nsysan.render.json import render_json

    if not args.library:
        malloc_tuning.keep_large_arrays_on_the_heap()
        malloc_tuning.avoid_transparent_huge_pages()
    sampler = Sampler()
    kept = {}  # the frames' columns (name, dtype, bytes), not the frames: the analysis lets them go

    def run_analyses(loaded, *rest, **options):
        sampler.enter("analyses")
        for name, frame in (("events", loaded.events), ("calls", loaded.calls), ("nvtx_ranges", loaded.ranges)):
            sizes = frame.memory_usage(index=False, deep=False)
            kept[name] = (len(frame), [(column, str(frame[column].dtype), size) for column, size in sizes.items()])
        return analyses_of(loaded, *rest, **options)

    pipeline.run_analyses = run_analyses
    analysis = pipeline.analyze_report(args.export, quick=args.quick, keep_events=False,
                                       progress=lambda stage, fraction: sampler.enter(stage) if fraction < 1 else None)
    sampler.enter("JSON")
    document = render_json(analysis)
    sampler.stop()
    print(f"{'stage':45s} {'s':>6s} {'peak MiB':>9s} {'at end':>8s}")
    for stage, seconds, peak, end in sampler.rows:
        print(f"{stage:45s} {seconds:6.2f} {peak:9.0f} {end:8.0f}")
    print(f"JSON document: {len(document) / 2**20:.1f} MiB")
    for name, (rows, columns) in kept.items():
        total = sum(size for _, _, size in columns)
        print(f"\n{name}: {rows:,} rows, {total / 2**20:.0f} MiB ({total / max(1, rows):.0f} B per row)")
        for column, dtype, size in columns:
            print(f"  {column:16s} {dtype:10s} {size / 2**20:8.1f} MiB")


if __name__ == "__main__":
    main()
