"""A check's result: one `Outcome` per limit and place, and the `Verdict`, the documented JSON
`nsysan/check@1` (docs/json.md). gate.py makes them from an `Analysis` and `Limits`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .tables import Tables

CHECK_SCHEMA_ID = "nsysan/check@1"
HELD, BROKEN, NOT_MEASURED = "held", "broken", "not_measured"
# A verdict's status and the exit code of `nsysan check` for it.
EXIT_CODES = {"pass": 0, "fail": 1, "not_measured": 2, "error": 2}


@dataclass(frozen=True)
class Outcome:
    """One limit at one place."""

    limit: str  # max-peak | max-peak-increase | max-never-freed | max-growth-per-step | ...
    where: str  # "GPU 0 (process 1644 python3)", "GPU 1", "all"
    ok: bool  # the limit held (False when it broke, and when it could not be measured)
    measured: Optional[float]  # bytes, a percentage (max-peak-increase in %), or a count; None: not measured
    threshold: str  # the limit as given, e.g. "900.0 MiB" or "10%"
    message: str  # one line: measured value, limit and where (or why it could not be measured)
    status: str = ""  # held | broken | not_measured; left out: held or broken, as `ok` says

    def __post_init__(self) -> None:
        if not self.status:
            object.__setattr__(self, "status", HELD if self.ok else BROKEN)


@dataclass(frozen=True)
class Verdict(Tables):  # Tables: frame("outcomes") for notebooks
    schema: str  # "nsysan/check@1"
    report: str
    baseline: Optional[str]
    per: str
    ok: bool  # status == "pass"
    outcomes: list[Outcome] = field(default_factory=list)
    comparison: Optional[str] = None  # the compare headline when there is a baseline
    # pass | fail (a limit broke) | not_measured (a limit could not be measured, and that was not
    # allowed) | error (the check could not run: `error` says why)
    status: str = "pass"
    allow_unmeasured: bool = False
    error: Optional[str] = None

    @property
    def broken(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == BROKEN]

    @property
    def unmeasured(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == NOT_MEASURED]

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    @staticmethod
    def of_error(report: str, baseline: Optional[str], message: str) -> "Verdict":
        """The verdict of a check that could not run (a missing baseline, an unreadable report)."""
        return Verdict(schema=CHECK_SCHEMA_ID, report=report, baseline=baseline, per="", ok=False, status="error",
                       error=message)

    def __repr__(self) -> str:
        """One line, for notebooks: the run and how many limits broke (the outcomes: `frame()`).

        >>> import nsysan
        >>> nsysan.check("fixtures/torch_leak_v25.sqlite", max_never_freed="1GiB")
        <nsysan.Verdict of torch_leak_v25.sqlite: 1 of 1 limits broke (max-never-freed)>
        """
        broken = sorted({o.limit for o in self.broken})
        unmeasured = sorted({o.limit for o in self.unmeasured})
        if self.status == "error":
            state = f"could not check: {self.error}"
        elif broken:
            state = f"{len(self.broken)} of {len(self.outcomes)} limits broke ({', '.join(broken)})"
        elif unmeasured:
            state = f"{len(self.unmeasured)} of {len(self.outcomes)} limits not measured ({', '.join(unmeasured)})"
        else:
            state = f"all {len(self.outcomes)} limits held"
        against = f" against {self.baseline[:80]}" if self.baseline else ""
        return f"<nsysan.Verdict of {self.report[:80]}{against}: {state}>"
