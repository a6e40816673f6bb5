"""Memory limits for CI: parsing them (human units, percentages, a config table) and checking a run.

`Limits.parse(max_peak="8GiB", max_peak_increase="5%")` raises NsysanError (exit 2) on a
malformed value; `evaluate_limits(analysis, baseline, limits)` returns a `Verdict` whose
outcomes are one per limit and place (process/GPU, GPU, or the whole run: `per`). The verdict is
the documented JSON `nsysan/check@1` (docs/json.md).

Sizes: a number with an optional unit. KiB/MiB/GiB/TiB are binary (1024), kB/MB/GB/TB decimal
(1000), and the short K/M/G/T are binary, as in Docker and `ulimit`. "0" is zero bytes.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from .compare import ProcessDelta, compare_analyses
from .errors import NsysanError
from .model import Analysis, Tables
from .units import fmt_bytes

SCHEMA_ID = "nsysan/check@1"
PER = ("process", "gpu", "all")
# The limit options, as spelled on the command line and in a config table.
OPTIONS = ("max-peak", "max-peak-increase", "max-never-freed", "max-growth-per-step",
           "no-failed-allocations", "no-warnings", "per")

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def parse_size(text: str, option: str = "size") -> int:
    """Bytes of "8GiB", "512 MiB", "1.5G", "900MB", "0"; NsysanError otherwise."""
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise NsysanError(f"--{option} {text!r} is not a size; write it like 8GiB, 512MiB, 900MB or 0")
    return int(round(float(match.group(1)) * _UNITS[unit]))


@dataclass(frozen=True)
class Amount:
    """A size in bytes or a percentage of the baseline."""

    bytes: Optional[int] = None
    percent: Optional[float] = None

    @staticmethod
    def parse(text: str, option: str) -> "Amount":
        match = _PERCENT.match(str(text))
        if match:
            return Amount(percent=float(match.group(1)))
        try:
            return Amount(bytes=parse_size(text, option))
        except NsysanError:
            raise NsysanError(f"--{option} {text!r} is neither a size nor a percentage; "
                              "write it like 5% or 512MiB") from None

    def __str__(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else fmt_bytes(self.bytes)


@dataclass(frozen=True)
class Limits:
    per: str = "process"
    max_peak: Optional[int] = None
    max_peak_increase: Optional[Amount] = None
    max_never_freed: Optional[int] = None
    max_growth_per_step: Optional[int] = None
    no_failed_allocations: bool = False
    no_warnings: tuple[str, ...] = ()  # diagnostic codes, or ("all",) for any warning or error

    @staticmethod
    def parse(per: Optional[str] = None, max_peak: Optional[str] = None,
              max_peak_increase: Optional[str] = None, max_never_freed: Optional[str] = None,
              max_growth_per_step: Optional[str] = None, no_failed_allocations: Optional[bool] = None,
              no_warnings: Optional[str] = None, defaults: Optional[Mapping[str, Any]] = None) -> "Limits":
        """Limits from command-line strings; `defaults` (a config table) fills what is not given."""
        given = {"per": per, "max-peak": max_peak, "max-peak-increase": max_peak_increase,
                 "max-never-freed": max_never_freed, "max-growth-per-step": max_growth_per_step,
                 "no-failed-allocations": no_failed_allocations or None, "no-warnings": no_warnings}
        merged = {k: v for k, v in (defaults or {}).items()}
        merged.update({k: v for k, v in given.items() if v is not None})
        per_value = str(merged.get("per", "process"))
        if per_value not in PER:
            raise NsysanError(f"--per {per_value!r}: use one of {', '.join(PER)}")

        def size(key: str) -> Optional[int]:
            return parse_size(str(merged[key]), key) if merged.get(key) is not None else None

        warnings = merged.get("no-warnings")
        if isinstance(warnings, (list, tuple)):
            warnings = ",".join(str(w) for w in warnings)
        if isinstance(warnings, bool):
            warnings = "all" if warnings else None
        codes = tuple(c.strip() for c in str(warnings).split(",") if c.strip()) if warnings else ()
        failed = merged.get("no-failed-allocations", False)
        if not isinstance(failed, bool):
            raise NsysanError(f"no-failed-allocations = {failed!r}: use true or false")
        increase = merged.get("max-peak-increase")
        return Limits(per=per_value, max_peak=size("max-peak"),
                      max_peak_increase=Amount.parse(str(increase), "max-peak-increase") if increase is not None
                      else None, max_never_freed=size("max-never-freed"),
                      max_growth_per_step=size("max-growth-per-step"), no_failed_allocations=failed,
                      no_warnings=codes)

    @property
    def empty(self) -> bool:
        return self == Limits(per=self.per)


def load_config(start: Path) -> tuple[Optional[Path], dict[str, Any]]:
    """The check limits of the nearest `nsysan.toml` or `pyproject.toml` with a check table, in
    `start` or a folder above it (up to the top of the repository); (None, {}) when there is none."""
    for folder in [start, *start.parents]:
        for name in ("nsysan.toml", "pyproject.toml"):
            path = folder / name
            table = read_config_file(path) if path.is_file() else None
            if table is not None:
                return path, table
        if (folder / ".git").exists():
            break  # the top of the repository: a config above it belongs to someone else
    return None, {}


def read_config_file(path: Path) -> Optional[dict[str, Any]]:
    """The check table of one file: `[tool.nsysan.check]`, or `[check]` in an nsysan.toml; None
    when it has none. Unknown keys and unreadable files are NsysanError."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        data: Any = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise NsysanError(f"{path} could not be read ({err})") from err
    table = data
    for key in ("tool", "nsysan", "check"):
        table = table.get(key) if isinstance(table, dict) else None
    if table is None and path.name != "pyproject.toml":
        table = data.get("check")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise NsysanError(f"{path}: the nsysan check entry is not a table")
    table = {str(k).replace("_", "-"): v for k, v in table.items()}
    unknown = sorted(set(table) - set(OPTIONS))
    if unknown:
        raise NsysanError(f"{path}: unknown check setting {unknown[0]!r}; known: {', '.join(OPTIONS)}")
    return table


@dataclass(frozen=True)
class Outcome:
    """One limit at one place."""

    limit: str  # max-peak | max-peak-increase | max-never-freed | max-growth-per-step | ...
    where: str  # "GPU 0 (process 1644 python3)", "GPU 1", "all"
    ok: bool
    measured: Optional[float]  # bytes, a percentage (max-peak-increase in %), or a count
    threshold: str  # the limit as given, e.g. "900.0 MiB" or "10%"
    message: str  # one line: measured value, limit and where


@dataclass(frozen=True)
class Verdict(Tables):  # Tables: frame("outcomes") for notebooks
    schema: str  # "nsysan/check@1"
    report: str
    baseline: Optional[str]
    per: str
    ok: bool
    outcomes: list[Outcome] = field(default_factory=list)
    comparison: Optional[str] = None  # the compare headline when there is a baseline

    @property
    def broken(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    def __repr__(self) -> str:
        """One line, for notebooks: the run and how many limits broke (the outcomes: `frame()`).

        >>> import nsysan
        >>> nsysan.check("fixtures/torch_leak_v25.sqlite", max_never_freed="1GiB")
        <nsysan.Verdict of torch_leak_v25.sqlite: 1 of 1 limits broke (max-never-freed)>
        """
        broken = sorted({o.limit for o in self.broken})
        state = f"{len(self.broken)} of {len(self.outcomes)} limits broke ({', '.join(broken)})" if broken \
            else f"all {len(self.outcomes)} limits held"
        against = f" against {self.baseline[:80]}" if self.baseline else ""
        return f"<nsysan.Verdict of {self.report[:80]}{against}: {state}>"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class _Unit:
    """One place the limits are checked at, with its numbers in this run and the baseline's."""

    where: str
    peak: Optional[int]
    never_freed: Optional[int]
    growth: Optional[int]
    base_peak: Optional[int] = None


def evaluate_limits(analysis: Analysis, baseline: Optional[Analysis], limits: Limits) -> Verdict:
    """Every limit at every place of `limits.per`; NsysanError when a limit cannot be evaluated."""
    if limits.max_peak_increase is not None and baseline is None:
        raise NsysanError("--max-peak-increase needs a baseline: add --baseline BASE (a report or its analysis.json)")
    if limits.empty:
        raise NsysanError("no limits to check: give at least one (--max-peak 8GiB, ...) or a "
                          "[tool.nsysan.check] table in pyproject.toml")
    comparison = compare_analyses(baseline if baseline is not None else analysis, analysis)
    units = _units(analysis, baseline, comparison.processes, limits.per)
    outcomes: list[Outcome] = []
    for unit in units:
        if limits.max_peak is not None and unit.peak is not None:
            outcomes.append(_at_most("max-peak", unit.where, unit.peak, limits.max_peak, "peak"))
        if limits.max_peak_increase is not None and unit.peak is not None:
            outcomes.append(_increase(unit, limits.max_peak_increase))
        if limits.max_never_freed is not None and unit.never_freed is not None:
            outcomes.append(_at_most("max-never-freed", unit.where, unit.never_freed, limits.max_never_freed,
                                     "never freed"))
        if limits.max_growth_per_step is not None and unit.growth is not None:
            outcomes.append(_at_most("max-growth-per-step", unit.where, unit.growth, limits.max_growth_per_step,
                                     "growth per step"))
    if limits.max_growth_per_step is not None and not any(u.growth is not None for u in units):
        _refuse_if_not_streamed(analysis, "--max-growth-per-step needs steps", section="growth")
        raise NsysanError(f"{analysis.source.name}: --max-growth-per-step needs steps, and none were found "
                          "(mark each training step with an NVTX range named like 'step 3')")
    if limits.no_failed_allocations:
        outcomes.extend(_failed_allocations(analysis, limits.per))
    if limits.no_warnings:
        outcomes.extend(_warnings(analysis, limits.no_warnings))
    return Verdict(schema=SCHEMA_ID, report=analysis.source.name,
                   baseline=baseline.source.name if baseline is not None else None, per=limits.per,
                   ok=all(o.ok for o in outcomes), outcomes=outcomes,
                   comparison=comparison.headline if baseline is not None else None)


def _units(analysis: Analysis, baseline: Optional[Analysis], rows: list[ProcessDelta], per: str) -> list[_Unit]:
    names = {p.pid: p.name for p in analysis.capture.processes}
    if per == "process":
        return [_Unit(where=_process_place(d, names),
                      peak=d.peak.after, never_freed=d.never_freed.after,
                      growth=d.growth_per_step.after if d.growth_per_step else None, base_peak=d.peak.before)
                for d in rows if d.new_pid is not None]
    # Per GPU: all processes on it together; the GPUs of the two runs matched in ascending order.
    kept: dict[int, int] = {}
    growth: dict[int, int] = {}
    for d in rows:
        if d.new_pid is not None and d.new_gpu is not None:
            kept[d.new_gpu] = kept.get(d.new_gpu, 0) + (d.never_freed.after or 0)
            if d.growth_per_step and d.growth_per_step.after is not None:
                growth[d.new_gpu] = growth.get(d.new_gpu, 0) + d.growth_per_step.after
    peaks = _gpu_peaks(analysis)
    base_peaks = _gpu_peaks(baseline) if baseline is not None else {}
    base_order = sorted(base_peaks)
    units = []
    for i, gpu in enumerate(sorted(set(peaks) | set(kept))):
        base_gpu = base_order[i] if i < len(base_order) else None
        units.append(_Unit(where=f"GPU {gpu}", peak=peaks.get(gpu), never_freed=kept.get(gpu, 0),
                           growth=growth.get(gpu), base_peak=base_peaks.get(base_gpu) if base_gpu is not None else None))
    if per == "gpu":
        return units
    # The whole run: its highest GPU peak, all never-freed bytes, the growth of all GPUs together.
    return [_Unit(where="all", peak=max(peaks.values(), default=None), never_freed=sum(kept.values()),
                  growth=sum(growth.values()) if growth else None,
                  base_peak=max(base_peaks.values(), default=None))]


def _process_place(d: ProcessDelta, names: dict[int, str]) -> str:
    """ "process 1644 python3 on GPU 0", with "rank 1, " ahead when processes are matched by rank."""
    rank = d.role.split(" · ")[0] + ", " if d.role.startswith("rank ") else ""
    name = f"process {d.new_pid} {names.get(d.new_pid or 0, '')}".rstrip()
    return f"{rank}{name} on GPU {d.new_gpu}" if d.new_gpu is not None else f"{rank}{name}"


def _gpu_peaks(analysis: Analysis) -> dict[int, int]:
    """Live GPU-resident bytes at each GPU's peak, all its processes together. The analysis
    lists a GPU's own peak only when several processes share it; else its one process's peak is it."""
    together = {p.device: p.peak_bytes for p in analysis.peaks if p.pid is None}  # device is the GPU id there
    alone: dict[int, int] = {}
    for p in analysis.peaks:
        gpu = p.gpu if p.gpu is not None else p.device
        if p.pid is not None and gpu not in together:
            alone[gpu] = max(alone.get(gpu, 0), p.peak_bytes)
    return {**alone, **together}


def _at_most(limit: str, where: str, measured: int, threshold: int, what: str) -> Outcome:
    ok = measured <= threshold
    relation = "within" if ok else "over"
    return Outcome(limit=limit, where=where, ok=ok, measured=measured, threshold=fmt_bytes(threshold),
                   message=f"{what} {fmt_bytes(measured)} is {relation} the limit of {fmt_bytes(threshold)} ({where})")


def _increase(unit: _Unit, amount: Amount) -> Outcome:
    if unit.base_peak is None:
        return Outcome(limit="max-peak-increase", where=unit.where, ok=True, measured=None, threshold=str(amount),
                       message=f"no match in the baseline, so the peak increase is not measured ({unit.where})")
    assert unit.peak is not None
    delta = unit.peak - unit.base_peak
    percent = 100.0 * delta / unit.base_peak if unit.base_peak else (0.0 if delta == 0 else float("inf"))
    if amount.percent is not None:
        ok, measured = percent <= amount.percent, round(percent, 2)
    else:
        assert amount.bytes is not None
        ok, measured = delta <= amount.bytes, delta
    sign = "+" if delta >= 0 else "-"
    shown = f"{sign}{fmt_bytes(abs(delta))} ({percent:+.1f}%)" if unit.base_peak else f"{sign}{fmt_bytes(abs(delta))}"
    relation = "within" if ok else "over"
    return Outcome(limit="max-peak-increase", where=unit.where, ok=ok, measured=measured, threshold=str(amount),
                   message=f"peak increase {shown}, {fmt_bytes(unit.base_peak)} → {fmt_bytes(unit.peak)}, is "
                           f"{relation} the limit of +{amount} ({unit.where})")


def _failed_allocations(analysis: Analysis, per: str) -> list[Outcome]:
    from .apis import family

    failed = [f for f in analysis.failed_calls if family(f.api) in ("alloc", "vmm", "pool")]
    names = {p.pid: p.name for p in analysis.capture.processes}
    if per == "process":
        pids = sorted({p.pid for p in analysis.capture.processes} | {f.pid for f in failed})
        places = [(f"process {pid} {names.get(pid, '')}".rstrip(), [f for f in failed if f.pid == pid]) for pid in pids]
    else:
        places = [("all", failed)]
    outcomes = []
    for where, calls in places:
        if calls:
            first = min(calls, key=lambda f: f.time_ns)
            message = (f"{len(calls)} failed allocation{'s' if len(calls) > 1 else ''}, the first "
                       f"{first.api} → {first.error} ({where})")
        else:
            message = f"no failed allocation ({where})"
        outcomes.append(Outcome(limit="no-failed-allocations", where=where, ok=not calls, measured=len(calls),
                                threshold="0", message=message))
    return outcomes


def _refuse_if_not_streamed(analysis: Analysis, need: str, codes: tuple[str, ...] = (),
                            section: Optional[str] = None) -> None:
    """Stop when a limit needs what the streamed full analysis of a large export did not compute
    (its diagnostic `not_streamed`; analyses/streamed_full.py): absent is not the same as held."""
    note = next((d for d in analysis.diagnostics if d.code == "not_streamed"), None)
    if note is None:
        return
    from .analyses.streamed_full import NOT_STREAMED, NOT_STREAMED_CODES

    if (codes and not set(codes) & set(NOT_STREAMED_CODES)) or (section is not None and section not in NOT_STREAMED):
        return
    raise NsysanError(f"{analysis.source.name}: {need}, which this analysis did not compute: the export is large "
                      "enough to be analyzed in bounded memory, where some sections are not computed yet (the "
                      "diagnostic not_streamed names them); check it from "
                      "nsysan.analyze(path, keep_events=True) on a machine with the memory for it")


def _warnings(analysis: Analysis, codes: tuple[str, ...]) -> list[Outcome]:
    _refuse_if_not_streamed(analysis, f"--no-warnings {','.join(codes)} needs the verdicts that raise them", codes)
    if codes == ("all",):
        found = [d for d in analysis.diagnostics if d.severity in ("warning", "error")]
        codes = tuple(sorted({d.code for d in found})) or ("all",)
    outcomes = []
    for code in codes:
        hits = [d for d in analysis.diagnostics if d.code == code or (code == "all" and d.severity != "info")]
        message = f"diagnostic {code}: {hits[0].message}" if hits else f"no {code} diagnostic"
        outcomes.append(Outcome(limit="no-warnings", where=code, ok=not hits, measured=len(hits), threshold="0",
                                message=message))
    return outcomes
