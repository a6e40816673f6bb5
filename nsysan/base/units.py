"""The one place sizes and times are formatted for people, and read from them (--max-peak 8GiB,
--spike-window 10ms); and the one check of --step-range's regular expression."""

from __future__ import annotations

import datetime
import re
from decimal import Decimal
from typing import Iterable, Optional

from ..errors import NsysanError

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def fmt_bytes(n: Optional[int], decimals: int = 1) -> str:
    """fmt_bytes(134217728) == "128.0 MiB"; binary units, one decimal unless told."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            return f"{sign}{int(value)} B" if unit == "B" else f"{sign}{value:.{decimals}f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fmt_signed_bytes(n: int) -> str:
    """A change of bytes: "+128.0 MiB", "-2.0 KiB", "0 B"."""
    return ("+" if n > 0 else "") + fmt_bytes(n)


def fmt_bytes_apart(a: int, b: int) -> tuple[str, str]:
    """Two sizes with the digits it takes to tell them apart: (5905580032, 5905580033) is not
    "5.5 GiB" and "5.5 GiB" but ("5,905,580,032 B", "5,905,580,033 B"); equal sizes as fmt_bytes."""
    for decimals in (1, 2, 3, 4):
        shown = fmt_bytes(a, decimals), fmt_bytes(b, decimals)
        if a == b or shown[0] != shown[1]:
            return shown
    return f"{a:,} B", f"{b:,} B"


def fmt_percent_apart(a: float, b: float) -> tuple[str, str]:
    """Two percentages, signed, with the decimals it takes to tell them apart ("+10.04%", "+10.00%")."""
    for decimals in (1, 2, 3, 4, 6):
        shown = f"{a:+.{decimals}f}%", f"{b:+.{decimals}f}%"
        if a == b or shown[0] != shown[1]:
            return shown
    return f"{a:+}%", f"{b:+}%"


# Times and durations of a second or more are in seconds, shorter ones in ms (or µs, ns): never
# "8729.35 ms" on one line and "10.125 s" on the next.
SECOND = 1_000_000_000


def fmt_time(ns: Optional[int]) -> str:
    """A time in ns from the capture start, e.g. "517.08 ms" or "8.729 s"."""
    return fmt_times([ns])[0]


def time_unit(values_ns: Iterable[Optional[int]]) -> str:
    """The one unit of a column of times: "s" when one of them reaches 1 s (as `fmt_time`), else "ms"."""
    return "s" if any(v is not None and abs(v) >= SECOND for v in values_ns) else "ms"


def fmt_time_in(ns: Optional[int], unit: str) -> str:
    """A time from the capture start in the column's unit: "0.982 s" next to "10.035 s"."""
    if ns is None:
        return "n/a"
    return f"{ns / 1e9:.3f} s" if unit == "s" else f"{ns / 1e6:.2f} ms"


def fmt_utc(ns: int) -> str:
    """A moment in ns since the epoch as UTC to the millisecond: "2026-11-29 18:10:59.123 UTC"."""
    moment = datetime.datetime.fromtimestamp(ns // SECOND, tz=datetime.timezone.utc)
    return f"{moment:%Y-%m-%d %H:%M:%S}.{(ns % SECOND) // 1_000_000:03d} UTC"


def fmt_duration(ns: Optional[int]) -> str:
    """A duration: "850 ns", "12.3 µs", "4.56 ms", "7.890 s"."""
    if ns is None:
        return "n/a"
    if ns < 1_000:
        return f"{ns} ns"
    if ns < 1_000_000:
        return f"{ns / 1e3:.1f} µs"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.3f} s"


def fmt_share(part: Optional[int], whole: Optional[int]) -> str:
    """'0.6%' of a whole (a GPU's capacity), or '-' when either is unknown."""
    return fmt_percent(part / whole) if part is not None and whole else "-"


def fmt_percent(fraction: float, signed: bool = False) -> str:
    """The one way a percentage is written: one decimal, "92.3%", or "+201.9%" for a change."""
    return f"{fraction:+.1%}" if signed else f"{fraction:.1%}"


def fmt_mib(n: Optional[int]) -> str:
    """Whole MiB, as nvidia-smi writes them: fmt_mib(6365904896) == "6071 MiB"."""
    if n is None:
        return "n/a"
    return f"{round(n / 2**20)} MiB"


# A Python file inside an installed package is shown from the package down ("torch/nn/...").
_PACKAGE_ROOT = re.compile(r"^.*[/\\](?:site|dist)-packages[/\\]")


def fmt_frame(function: str, file: str = "", line: Optional[int] = None, module: str = "") -> str:
    """One stack frame: "main (torch_train.py:43)", "to (torch/nn/modules/module.py:1384)",
    "alloc_weights (known)"."""
    if file:
        where = _PACKAGE_ROOT.sub("", file) if _PACKAGE_ROOT.search(file) else re.split(r"[/\\]", file)[-1]
        return f"{function} ({where}:{line})" if line is not None else f"{function} ({where})"
    return f"{function} ({module})" if module else function


def fmt_times(values: list[Optional[int]]) -> list[str]:
    """Times for one column, all in one unit: seconds when any reaches 1 s, else ms."""
    unit = time_unit(values)
    return [fmt_time_in(v, unit) for v in values]


_DURATION_UNITS = ((1_000_000_000, "s", 3), (1_000_000, "ms", 2), (1_000, "µs", 1))


def fmt_durations(values: list[Optional[int]]) -> list[str]:
    """Durations for one column, all in the unit of the longest ("306.53 ms", "10.28 ms")."""
    longest = max((abs(v) for v in values if v is not None), default=0)
    for scale, unit, digits in _DURATION_UNITS:
        if longest >= scale:
            return ["n/a" if v is None else f"{v / scale:.{digits}f} {unit}" for v in values]
    return ["n/a" if v is None else f"{v} ns" for v in values]


# Sizes: a number with an optional unit. KiB/MiB/GiB/TiB are binary (1024), kB/MB/GB/TB decimal
# (1000), and the short K/M/G/T are binary, as in Docker and `ulimit`. "0" is zero bytes.
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
               "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
               "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")

# The largest size an option takes: what a signed 64-bit integer holds (the JSON documents and
# nsysan.db store bytes as such), 8 EiB, far beyond any GPU.
MAX_SIZE_BYTES = (1 << 63) - 1


def parse_size(text: object, option: str = "size") -> int:
    """Bytes of "8GiB", "512 MiB", "1.5G", "900MB", "0" (or an int of bytes), from 0 to 8 EiB;
    NsysanError otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        return _size_in_range(text, option, shown_value(text))
    match = _SIZE.match(text) if isinstance(text, str) else None
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _SIZE_UNITS:
        raise NsysanError(f"--{option} {shown_value(text)} is not a size; write it like 8GiB, 512MiB, 900MB or 0")
    # Decimal, not float: 400 digits are a size too large, not an infinity that crashes int()
    number = int((Decimal(match.group(1)) * _SIZE_UNITS[unit]).to_integral_value())
    return _size_in_range(number, option, shown_value(text))


def _size_in_range(number: int, option: str, shown: str) -> int:
    if number < 0:
        raise NsysanError(f"--{option} {shown} is negative; a size is 0 or more, like 8GiB")
    if number > MAX_SIZE_BYTES:
        raise NsysanError(f"--{option} {shown} is larger than 8 EiB, the most a size can be; write it like 8GiB")
    return number


_DURATION_SUFFIXES = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


# The longest window a duration option takes: a day (longer than any capture nsys can make in
# memory). A duration is at least 1 ns.
MAX_DURATION_NS = 86_400 * 1_000_000_000


def parse_duration(text: str, option: str = "duration") -> int:
    """"10ms", "0.5 s", "200us" or "1500ns" as ns (1 ns to a day); a bare number is ms. Raises
    ValueError saying what is accepted."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ns|us|µs|ms|s)?\s*", str(text or ""))
    if not match:
        raise ValueError(f"{option} {shown_value(text)} is not a duration; give one like 10ms, 0.5s or 200us")
    # Decimal, not float: 400 digits are a number too large, not an infinity that crashes int()
    ns = int((Decimal(match.group(1)) * _DURATION_SUFFIXES[match.group(2) or "ms"]).to_integral_value())
    return check_duration_ns(ns, option, shown_value(text))


def check_duration_ns(ns: object, option: str, shown: str = "") -> int:
    """`ns` when it is a whole number of ns from 1 ns to a day; ValueError saying so otherwise
    (the command line's --spike-window and the API's spike_window_ns say the same)."""
    what = f"{option} {shown or shown_value(ns)}"
    if isinstance(ns, bool) or not isinstance(ns, int):
        raise ValueError(f"{what} is not a duration; give one like 10ms, 0.5s or 200us")
    if ns < 1:
        raise ValueError(f"{what} is not a duration: it must be at least 1 ns; give one like 10ms, 0.5s or 200us")
    if ns > MAX_DURATION_NS:
        raise ValueError(f"{what} is longer than a day, the most it can be; give one like 10ms, 0.5s or 200us")
    return ns


def check_step_range(pattern: Optional[str]) -> None:
    """Fail before any work when --step-range (a regular expression) does not compile."""
    if pattern is None:
        return
    try:
        re.compile(pattern)
    except re.error as err:
        raise NsysanError(f"--step-range {pattern!r} is not a regular expression ({err})") from None


def shown_value(value: object, limit: int = 40) -> str:
    """A value as an error line quotes it: its repr, cut to `limit` characters (a 400-digit
    number is named, not printed whole)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 13]}... ({len(text)} chars)"
