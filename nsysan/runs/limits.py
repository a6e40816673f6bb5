"""Memory limits for CI: parsing them (human units, percentages, a config table).

`Limits.parse(max_peak="8GiB", max_peak_increase="5%")` raises NsysanError (exit 2) on a
malformed value; gate.evaluate_limits checks a run against them.

Sizes (units.parse_size): a number with an optional unit. KiB/MiB/GiB/TiB are binary (1024), kB/MB/GB/TB decimal
(1000), and the short K/M/G/T are binary, as in Docker and `ulimit`. "0" is zero bytes.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from ..errors import NsysanError
from ..model import DIAGNOSTIC_CODES
from ..base.units import fmt_bytes, parse_size, shown_value

PER = ("process", "gpu", "all")
# The limit options, as spelled on the command line and in a config table.
OPTIONS = ("max-peak", "max-peak-increase", "max-never-freed", "max-growth-per-step",
           "no-failed-allocations", "no-warnings", "per", "allow-unmeasured")
SIZE_OPTIONS = ("max-peak", "max-peak-increase", "max-never-freed", "max-growth-per-step")
BOOL_OPTIONS = ("no-failed-allocations", "allow-unmeasured")
# On the command line, this value switches off a limit that the config table sets.
OFF = "none"

MAX_CONFIG_BYTES = 4 << 20  # a pyproject.toml is kilobytes

_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


MAX_PERCENT = 1_000_000.0  # a peak 10,000 times the baseline's


@dataclass(frozen=True)
class Amount:
    """A size in bytes or a percentage of the baseline."""

    bytes: Optional[int] = None
    percent: Optional[float] = None

    @staticmethod
    def parse(text: str, option: str) -> "Amount":
        match = _PERCENT.match(str(text))
        if match:
            percent = float(match.group(1))
            if percent > MAX_PERCENT:
                raise NsysanError(f"--{option} {shown_value(text)} is more than {MAX_PERCENT:,.0f}%, the most it "
                                  "can be; write it like 5% or 512MiB")
            return Amount(percent=percent)
        try:
            return Amount(bytes=parse_size(text, option))
        except NsysanError as err:
            if "is not a size" not in err.message:
                raise  # a size out of range says so
            raise NsysanError(f"--{option} {shown_value(text)} is neither a size nor a percentage; "
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
    allow_unmeasured: bool = False  # a limit that cannot be measured is a note, not exit code 2

    @staticmethod
    def parse(per: Optional[str] = None, max_peak: Optional[str] = None,
              max_peak_increase: Optional[str] = None, max_never_freed: Optional[str] = None,
              max_growth_per_step: Optional[str] = None, no_failed_allocations: Optional[bool] = None,
              no_warnings: Optional[str] = None, defaults: Optional[Mapping[str, Any]] = None,
              allow_unmeasured: Optional[bool] = None) -> "Limits":
        """Limits from command-line strings; `defaults` (a config table) fills what is not given,
        and a given "none" switches off what the table sets. A boolean given False wins too."""
        given = {"per": per, "max-peak": max_peak, "max-peak-increase": max_peak_increase,
                 "max-never-freed": max_never_freed, "max-growth-per-step": max_growth_per_step,
                 "no-failed-allocations": no_failed_allocations, "no-warnings": no_warnings,
                 "allow-unmeasured": allow_unmeasured}
        merged = {k: v for k, v in (defaults or {}).items()}
        merged.update({k: v for k, v in given.items() if v is not None})
        merged = {k: v for k, v in merged.items() if not (isinstance(v, str) and v.strip().lower() == OFF)}
        per_value = str(merged.get("per", "process"))
        if per_value not in PER:
            raise NsysanError(f"--per {per_value!r}: use one of {', '.join(PER)}")

        def size(key: str) -> Optional[int]:
            return parse_size(str(merged[key]), key) if merged.get(key) is not None else None

        def flag(key: str) -> bool:
            value = merged.get(key, False)
            if not isinstance(value, bool):
                raise NsysanError(f"{key} = {value!r}: use true or false")
            return value

        warnings = merged.get("no-warnings")
        if isinstance(warnings, (list, tuple)):
            warnings = ",".join(str(w) for w in warnings)
        if isinstance(warnings, bool):
            warnings = "all" if warnings else None
        codes = tuple(c.strip() for c in str(warnings).split(",") if c.strip()) if warnings else ()
        unknown = [c for c in codes if c != "all" and c not in DIAGNOSTIC_CODES]
        if unknown:
            near = difflib.get_close_matches(unknown[0], sorted(DIAGNOSTIC_CODES), n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            raise NsysanError(f"--no-warnings {shown_value(unknown[0])} is not a diagnostic code; {hint}give codes "
                              "from docs/analyses.md#diagnostics, comma-separated, or all")
        increase = merged.get("max-peak-increase")
        return Limits(per=per_value, max_peak=size("max-peak"),
                      max_peak_increase=Amount.parse(str(increase), "max-peak-increase") if increase is not None
                      else None, max_never_freed=size("max-never-freed"),
                      max_growth_per_step=size("max-growth-per-step"),
                      no_failed_allocations=flag("no-failed-allocations"), no_warnings=codes,
                      allow_unmeasured=flag("allow-unmeasured"))

    @property
    def empty(self) -> bool:
        return self == Limits(per=self.per, allow_unmeasured=self.allow_unmeasured)


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


def read_named_config(path: Path, option: str) -> dict[str, Any]:
    """The check table of the config file named by `option` (--config): NsysanError when it has none."""
    table = read_config_file(path)  # a missing file, a FIFO or a device is said there
    if table is None:
        raise NsysanError(f"{option} {path}: no [tool.nsysan.check] table in it")
    return table


def read_config_file(path: Path) -> Optional[dict[str, Any]]:
    """The check table of one file: `[tool.nsysan.check]`, or `[check]` in an nsysan.toml; None
    when it has none. Unknown keys and unreadable files are NsysanError."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    from ..sources.export import read_regular

    raw = read_regular(path, str(path), MAX_CONFIG_BYTES)  # never a FIFO or /dev/zero
    try:
        data: Any = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise NsysanError(f"{path} could not be read ({err})") from err
    except RecursionError:  # tomllib recurses once per nesting level: a = [[[[...
        raise NsysanError(f"{path} could not be read (nested too deeply)") from None
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
    for key in SIZE_OPTIONS:
        value = table.get(key)
        # A bare number has no unit: `max-peak = 8` would be 8 bytes, surely not what was meant.
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value != 0:
            example = "5%" if key == "max-peak-increase" else f"{value:g}GiB"
            raise NsysanError(f"{path}: {key} = {value!r} is a number without a unit; write it as a string "
                              f"with one, like {key} = \"{example}\" (\"{value:g}B\" for bytes)")
    for key in BOOL_OPTIONS:
        if key in table and not isinstance(table[key], bool):
            raise NsysanError(f"{path}: {key} = {table[key]!r}: use true or false")
    return table
