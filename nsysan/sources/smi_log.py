"""Read nvidia-smi CSV logs as people write them, into one frame of samples in UTC.

Two kinds of log, told apart by their columns:

- `--query-gpu=timestamp,index,uuid,memory.used,... --format=csv -l 1` ("gpu"): one row per GPU
  per sample, `memory.used` being everything allocated on the GPU;
- `--query-compute-apps=timestamp,gpu_uuid,pid,process_name,used_memory --format=csv -lms 100`
  ("apps"): one row per process per sample.

Any subset and order of columns is read (unknown ones are ignored); header names come with or
without their unit (`memory.used [MiB]`), values with or without theirs (`nounits`). A log
without a header (`noheader`) needs its columns from the caller (`--smi-columns`). nvidia-smi
writes local time without a zone, so the zone is the caller's (`--smi-tz`, UTC by default).

Anything wrong with the file itself raises NsysanError (one line, exit 2); rows that cannot be
read (a truncated last line, `[N/A]` values) are skipped and counted for a diagnostic.
"""

from __future__ import annotations

import codecs
import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from ..errors import NsysanError
from ..base.units import shown_value

# Header names (lower case, unit removed) -> what they hold. Several nvidia-smi spellings mean
# the same thing: `uuid` in --query-gpu is `gpu_uuid` in --query-compute-apps, and
# `used_memory` is the documented alias of `used_gpu_memory`, the name nvidia-smi writes.
COLUMN_ALIASES = {
    "timestamp": "time",
    "index": "gpu_index",
    "uuid": "gpu_uuid", "gpu_uuid": "gpu_uuid",
    "pci.bus_id": "gpu_bus", "gpu_bus_id": "gpu_bus",
    "memory.used": "gpu_used",
    "used_gpu_memory": "process_used", "used_memory": "process_used",
    "memory.total": "total",
    "pid": "pid",
    "process_name": "process_name",
}

SAMPLE_COLUMNS = {
    "utc_ns": "int64",  # when nvidia-smi took the sample, ns since the Unix epoch, UTC
    "gpu_index": "int32",  # nvidia-smi's GPU index, -1 when the log has none
    "gpu_uuid": "object",  # "783f4d28-..." (lower case, without "GPU-"), "" when the log has none
    "gpu_bus": "object",  # "00000000:06:00.0" as nvidia-smi writes it, "" when the log has none
    "pid": "int64",  # process id (apps logs), -1 in gpu logs
    "process_name": "object",
    "used_bytes": "int64",  # memory.used (gpu) or used_memory (apps)
    "total_bytes": "int64",  # memory.total, -1 when not logged
}

_UNIT_BYTES = {"": None, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
               "kb": 10**3, "mb": 10**6, "gb": 10**9}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_HEADER_UNIT = re.compile(r"\[([^\]]*)\]")
NVIDIA_SMI_TIME = "%Y/%m/%d %H:%M:%S.%f"  # what --query-*=timestamp writes: 2026/11/30 11:19:17.278
# A day of -lms 100 on 8 GPUs is 0.6 GB; a larger log is cut to the capture's hours first (its
# lines are held in memory, several times their size).
MAX_LOG_BYTES = 1 << 30
MAX_LINE = 4096  # longer lines are not nvidia-smi's; a garbage file must not make giant fields


@dataclass
class SmiLog:
    """One nvidia-smi log, read: which kind, what it held, its samples in UTC."""

    name: str  # the file name, as shown to the user
    kind: str  # "gpu" (--query-gpu) | "apps" (--query-compute-apps)
    columns: list[str]  # the log's columns, as nvidia-smi names them (units removed)
    samples: pd.DataFrame  # SAMPLE_COLUMNS, in the file's order
    tz: str  # the zone its timestamps were read in
    utc_offset_ns: int = 0  # that zone's offset from UTC at the log's first sample
    skipped_rows: int = 0  # rows that could not be read
    skipped_example: str = ""  # the first of them, cut, for the diagnostic


def read_smi_logs(paths: Sequence[Path], columns: Sequence[str] = (), tz: str = "UTC") -> list[SmiLog]:
    """Read several logs. `columns` (comma-separated lists) name the columns of logs without a
    header: one list for all of them, or one per log, in order."""
    if columns and len(columns) not in (1, len(paths)):
        raise NsysanError(f"--smi-columns was given {len(columns)} times for {len(paths)} --smi logs; give it "
                          "once (for every log without a header) or once per log, in the same order")
    per_log = list(columns) * len(paths) if len(columns) == 1 else list(columns) or [None] * len(paths)
    logs = [read_smi_log(Path(p), _split(c) if c else None, tz) for p, c in zip(paths, per_log)]
    names = [log.name for log in logs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise NsysanError(f"--smi {twice[0]} is given twice (logs are told apart by file name)")
    return logs


def _split(columns: str) -> list[str]:
    names = [c for c in (part.strip() for part in columns.split(",")) if c]
    if not names:
        raise NsysanError("--smi-columns is empty; give the log's columns, e.g. timestamp,index,memory.used")
    return names


def read_smi_log(path: Path, columns: Optional[Sequence[str]] = None, tz: str = "UTC") -> SmiLog:
    """Read one nvidia-smi CSV log; `columns` are used when the file has no header line."""
    name = Path(path).name
    zone = parse_tz(tz)
    from .export import read_regular

    raw = read_regular(Path(path), f"--smi {name}", MAX_LOG_BYTES)  # never a FIFO or /dev/zero
    # (line number in the file, line): an impossible value is refused naming its line
    numbered = [(i + 1, line) for i, line in enumerate(_text(raw).splitlines()) if line.strip()]
    if not numbered:
        raise NsysanError(f"--smi {name} is empty; log with nvidia-smi --query-gpu=timestamp,index,uuid,"
                          "memory.used --format=csv -lms 100 (see docs/cli.md)")
    header = _header_names(numbered[0][1])
    if header is not None:
        header_line = numbered[0][1].strip()
        names, body = header, [(n, line) for n, line in numbered[1:] if line.strip() != header_line]  # appended runs repeat it
    elif columns:
        names, body = [_normalize(c) for c in columns], numbered
    else:
        raise NsysanError(f"--smi {name} has no header line; give its columns in order with --smi-columns "
                          "(the --query-gpu or --query-compute-apps list, e.g. timestamp,index,memory.used)")
    units = [_HEADER_UNIT.search(n) for n in names]
    names = [_HEADER_UNIT.sub("", n).strip() for n in names]
    kind = _kind(names, name)
    if not body:
        raise NsysanError(f"--smi {name} has a header but no samples; was nvidia-smi stopped at once?")
    frame, skipped, example = _parse_rows(body, names, [u.group(1) if u else "" for u in units], kind, zone,
                                          f"--smi {name}")
    if frame.empty:
        why = f" (the first: {example!r})" if example else ""
        raise NsysanError(f"--smi {name}: none of its {len(body)} rows could be read as {', '.join(names)}"
                          f"{why}; check the file or --smi-columns")
    first = dt.datetime.fromtimestamp(int(frame["utc_ns"].iloc[0]) // 10**9, dt.timezone.utc)
    offset = first.astimezone(zone).utcoffset() or dt.timedelta(0)
    return SmiLog(name=name, kind=kind, columns=names, samples=frame, tz=tz,
                  utc_offset_ns=int(offset.total_seconds()) * 10**9, skipped_rows=skipped, skipped_example=example)


def _text(raw: bytes) -> str:
    """A log's text: UTF-8, or UTF-16 when it starts with its byte-order mark (Windows PowerShell's
    `nvidia-smi ... > gpu.csv` writes UTF-16LE); a UTF-8 byte-order mark (Excel, PowerShell 7's
    utf8BOM) is dropped. Undecodable bytes become U+FFFD: their rows are skipped and counted."""
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return raw.decode("utf-16", "replace")
    return raw.decode("utf-8-sig", "replace")


def parse_tz(spec: str) -> dt.tzinfo:
    """`UTC`, an IANA zone (`Europe/Paris`) or a fixed offset (`+02:00`, `UTC-5`, `-0530`)."""
    if not isinstance(spec, str):  # the API's smi_tz=5: said as the command line says it
        raise NsysanError(f"--smi-tz {shown_value(spec)} is not a time zone; give an IANA name like Europe/Paris "
                          "or an offset like +02:00")
    text = spec.strip()
    if text.upper() in ("UTC", "Z", "GMT"):
        return dt.timezone.utc
    fixed = re.fullmatch(r"(?:UTC|GMT)?\s*([+-])(\d{1,2})(?::?(\d{2}))?", text, re.I)
    if fixed:
        sign = 1 if fixed.group(1) == "+" else -1
        hours, minutes = int(fixed.group(2)), int(fixed.group(3) or 0)
        if hours < 24 and minutes < 60:
            return dt.timezone(sign * dt.timedelta(hours=hours, minutes=minutes))
    try:
        from zoneinfo import ZoneInfo

        return ZoneInfo(text)
    except Exception as err:  # ZoneInfoNotFoundError, ValueError for paths, no tz database
        raise NsysanError(f"--smi-tz {shown_value(spec)} is not a time zone; give an IANA name like Europe/Paris "
                          "or an offset like +02:00") from err


def _normalize(name: str) -> str:
    return name.strip().lower()


def _header_names(line: str) -> Optional[list[str]]:
    """The header's names (lower case, units kept for now), or None when the line is data."""
    names = [_normalize(n) for n in line[:MAX_LINE].split(",")]
    known = [n for n in names if _HEADER_UNIT.sub("", n).strip() in COLUMN_ALIASES]
    return names if known else None


def _kind(names: list[str], name: str) -> str:
    meaning = [COLUMN_ALIASES.get(n) for n in names]
    duplicated = {m for m in meaning if m and meaning.count(m) > 1}
    if duplicated:
        raise NsysanError(f"--smi {name} names the same column twice ({', '.join(sorted(duplicated))})")
    if "time" not in meaning:
        raise NsysanError(f"--smi {name} has no timestamp column (its columns: {', '.join(names)}); "
                          "log with nvidia-smi --query-gpu=timestamp,index,uuid,memory.used --format=csv")
    if "process_used" in meaning and "pid" in meaning:
        return "apps"
    if "gpu_used" in meaning:
        return "gpu"
    raise NsysanError(f"--smi {name} has neither memory.used (--query-gpu) nor pid and used_memory "
                      f"(--query-compute-apps) (its columns: {', '.join(names)})")


def _parse_rows(body: list[tuple[int, str]], names: list[str], header_units: list[str], kind: str,
                zone: dt.tzinfo, what: str) -> tuple[pd.DataFrame, int, str]:
    width = len(names)
    meaning = [COLUMN_ALIASES.get(n) for n in names]
    name_at = meaning.index("process_name") if "process_name" in meaning else None
    rows: list[list[str]] = []
    numbers: list[int] = []
    bad: list[str] = []
    for number, line in body:
        fields = [f.strip() for f in line[:MAX_LINE].split(",")]
        if len(fields) > width and name_at is not None:
            # nvidia-smi does not quote: a process name with commas spreads over several fields
            extra = len(fields) - width
            fields[name_at:name_at + extra + 1] = [", ".join(fields[name_at:name_at + extra + 1])]
        if len(fields) == width:
            rows.append(fields)
            numbers.append(number)
        else:
            bad.append(line)
    table = pd.DataFrame(rows, columns=[m or f"_{i}" for i, m in enumerate(meaning)], dtype=object)
    absent = pd.Series(-1.0, index=table.index)  # a column the log does not have
    used_column = "gpu_used" if kind == "gpu" else "process_used"
    utc_ns = _utc_ns(table["time"], zone)
    used = _sizes(table[used_column], header_units[meaning.index(used_column)])
    total = _sizes(table["total"], header_units[meaning.index("total")]) if "total" in table else absent
    pid, index = (pd.to_numeric(table[c], errors="coerce") if c in table else absent for c in ("pid", "gpu_index"))
    ok = utc_ns.notna() & used.notna() & pid.notna() & index.notna()
    bad.extend(", ".join(map(str, r)) for r in table.loc[~ok].itertuples(index=False))  # the few bad rows only
    _refuse_impossible(what, numbers, ok, {"memory.used" if kind == "gpu" else "used_memory": used,
                                           "memory.total": total}, index, pid)
    keep = ok.to_numpy()
    frame = pd.DataFrame({
        "utc_ns": utc_ns[keep].astype("int64").to_numpy(),
        "gpu_index": index[keep].astype("int32").to_numpy(),
        "gpu_uuid": (table["gpu_uuid"][keep].str.lower().str.removeprefix("gpu-").to_numpy()
                     if "gpu_uuid" in table else ""),
        "gpu_bus": table["gpu_bus"][keep].to_numpy() if "gpu_bus" in table else "",
        "pid": pid[keep].astype("int64").to_numpy(),
        "process_name": table["process_name"][keep].to_numpy() if "process_name" in table else "",
        "used_bytes": used[keep].astype("int64").to_numpy(),
        "total_bytes": total[keep].fillna(-1).astype("int64").to_numpy(),
    })
    example = bad[0][:120] if bad else ""
    return frame.astype(SAMPLE_COLUMNS), len(bad), example


# A timestamp that names its zone: ...Z, ...+02:00, ...-0530 (ISO 8601, from a converted log).
_ZONED = r"(?:[zZ]|[+-]\d{2}:?\d{2})\s*$"


def _utc_ns(text: pd.Series, zone: dt.tzinfo) -> pd.Series:
    """nvidia-smi's local times in `zone`, or ISO 8601 times (in `zone` unless they name their
    own, which wins) -> ns since the epoch (UTC, Int64); <NA> where unreadable."""
    times = pd.to_datetime(text, format=NVIDIA_SMI_TIME, errors="coerce")
    zoned = times.isna() & text.str.contains(_ZONED, regex=True).fillna(False).astype(bool)
    naive_iso = times.isna() & text.notna() & ~zoned
    if naive_iso.any():  # ISO times without a zone, from a log someone converted
        times[naive_iso] = pd.to_datetime(text[naive_iso], format="ISO8601", errors="coerce")
    if zone is not dt.timezone.utc and not times.empty:
        # A local time that happens twice (the autumn DST change) or never is not guessed at.
        times = times.dt.tz_localize(zone, ambiguous="NaT", nonexistent="NaT").dt.tz_convert("UTC")
        times = times.dt.tz_localize(None)
    values = pd.Series(times.to_numpy(dtype="datetime64[ns]").view("int64"), index=text.index, dtype="Int64")
    values = values.mask(times.isna())
    if zoned.any():  # each line in its own zone, whatever --smi-tz says
        aware = pd.to_datetime(text[zoned], format="ISO8601", utc=True, errors="coerce")
        utc = pd.Series(aware.dt.tz_localize(None).to_numpy(dtype="datetime64[ns]").view("int64"),
                        index=aware.index, dtype="Int64")
        values[zoned] = utc.mask(aware.isna())
    return values


# What no nvidia-smi sample can be: more memory than 1 PiB on one GPU (the largest hold 0.2 TiB),
# a GPU index past 65,535 or a process id past 2^31 (Linux allows 2^22). A silent wrap to int32
# or a sample of 9e12 MiB would pass into the overlay as a real value.
MAX_SAMPLE_BYTES = 1 << 50
MAX_GPU_INDEX = 65_535
MAX_PID = (1 << 31) - 1


def _refuse_impossible(what: str, numbers: list[int], ok: pd.Series, sizes: dict[str, pd.Series],
                       index: pd.Series, pid: pd.Series) -> None:
    """NsysanError naming the first line whose value no nvidia-smi writes."""
    checks = [(values, values > MAX_SAMPLE_BYTES, f"{name} of {{:,.0f}} bytes is more than 1 PiB, more than any GPU "
               "holds") for name, values in sizes.items()]
    checks += [(index, (index > MAX_GPU_INDEX) | (index < -1), "GPU index {:.0f} is not one nvidia-smi writes "
                "(0 to 65535)"),
               (pid, (pid > MAX_PID) | (pid < -1), "process id {:.0f} is not one a process can have (up to 2^31-1)")]
    for values, wrong, message in checks:
        wrong = (wrong.fillna(False).astype(bool) & ok).to_numpy()
        if wrong.any():
            at = int(np.argmax(wrong))
            raise NsysanError(f"{what} line {numbers[at]}: {message.format(float(values.iloc[at]))}; "
                              "check the file (was it edited?)")


def _sizes(text: pd.Series, header_unit: str) -> pd.Series:
    """'6071 MiB' or '6071' (unit from the header, else MiB, nvidia-smi's) -> bytes; NaN for
    '[N/A]', '[Not Supported]', '[Insufficient Permissions]' and anything else."""
    parts = text.str.extract(_SIZE)
    number = pd.to_numeric(parts[0], errors="coerce")
    default = _UNIT_BYTES.get(header_unit.strip().lower()) or 2**20
    unit = parts[1].fillna("").str.lower().map(lambda u: _UNIT_BYTES.get(u, -1) if u else default)
    scale = unit.where(unit > 0)  # an unknown unit makes the row unreadable
    return (number.astype(float) * scale).round()  # in floats: 9e12 MiB must not wrap around int64
