"""Analyses already made, kept as their JSON documents beside the export cache, so that `check`,
`compare` and `batch` on the same input with the same options read a file instead of analyzing
again (a CI job that checks a run and then compares it analyzes it once).

    <cache>/analyses/<key>.analysis.json       key = sha256 of (input bytes, nsysan, options)

What goes into the key:
- the input's content (sha256), never its name: the same report copied elsewhere is reused, and
  the document read back names the path given this time;
- nsysan itself: a digest of its own source files (its version among them), so that any change of the
  code (a new release, or an edit of an editable install) misses every older entry;
- every option the analysis was asked for (`options`, the keyword arguments handed on to
  pipeline.analyze_report), whatever they are: an option added later is in the key without
  touching this module. Files among them count by their content. Only NOT_IN_DOCUMENT, which
  change how the analysis runs but never its document, are left out;
- for a report: the version of the nsys that would export it, and the export beside it
  (`<stem>.sqlite`, its size and time), which the analysis may read in its place.

Entries are written whole (a temporary file renamed over the entry): concurrent writers of one
key write the same document and the last rename wins; a reader sees one whole document or none.
An entry that can't be read is analyzed again and replaced. Nothing here ever fails a command:
a cache that can't be written is skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import weakref
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from ..base.keep import keep_text
from ..errors import NsysanError
from ..model import Analysis
from ..sources.export.input_files import file_digest

SUBDIR = "analyses"
# Options of analyze_report that decide how an analysis runs, never what its document says: the
# whole-frame and streamed paths give the same document (tests/test_bounded_memory.py), and
# progress and the raw frames are not in it.
NOT_IN_DOCUMENT = frozenset({"progress", "keep_events", "max_memory", "cache_dir"})


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """A digest of nsysan's own .py files: an analysis made by other code is never reused, also
    when the version string stayed the same (the version is in __init__.py, one of the files)."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for source in sorted(package.rglob("*.py")):
        digest.update(str(source.relative_to(package)).encode() + b"\0")
        with contextlib.suppress(OSError):
            digest.update(source.read_bytes())
    return digest.hexdigest()


def _canonical(value: Any) -> Any:
    """An option's value as plain JSON data: files by their content, dataclasses by their fields."""
    if isinstance(value, os.PathLike):
        path = Path(value)
        try:
            return {"file": file_digest(path)} if path.is_file() else {"path": str(path)}
        except OSError:
            return {"path": str(path)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__name__,
                **{f.name: _canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_canonical(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)  # anything else by its text (an option of a type this module never saw)


def analysis_key(content: str, options: Mapping[str, Any], exporter: Optional[str] = None) -> str:
    """The entry of the input whose bytes hash to `content`, analyzed with `options` (their names
    and values, NOT_IN_DOCUMENT left out) by this nsysan; `exporter`: what decides the export of
    a report (see report_exporter)."""
    material = {
        "content": content,
        "nsysan": code_digest(),
        "options": {name: _canonical(value) for name, value in sorted(options.items())
                    if name not in NOT_IN_DOCUMENT},
        "exporter": exporter,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def report_exporter(report: Path, nsys: Any, cache_dir: Optional[Path] = None) -> Optional[str]:
    """For a .nsys-rep/.qdrep: the version of the nsys that would export it and the export beside
    it, which decide the document as much as the report's bytes; None for an export. The version
    comes from the memo in the export cache at `cache_dir` when that nsys was asked before."""
    from ..sources import export

    if report.suffix.lower() not in export.REPORT_SUFFIXES:
        return None
    try:
        found = export.remembered_nsys_version(export.find_nsys(nsys, report=report), cache_dir)
    except NsysanError:
        found = "none"  # the export beside it is read, or the analysis fails (and nothing is kept)
    sibling = report.with_suffix(".sqlite")
    try:
        stat = sibling.stat()
        beside = f"{stat.st_size}:{stat.st_mtime_ns}"
    except OSError:
        beside = "none"
    return f"nsys {found}; beside {beside}"


def entry_path(cache_dir: Optional[Path], key: str) -> Path:
    from ..sources.export import resolve_cache_dir

    return resolve_cache_dir(cache_dir) / SUBDIR / f"{key}.analysis.json"


def read_entry(entry: Path, given: Path) -> Optional[Analysis]:
    """The analysis kept at `entry`, naming `given` as its input; None when there is none or it
    can't be read (it is then made again)."""
    from ..sources.analysis_document import load_analysis

    if not entry.is_file():
        return None
    try:
        analysis = load_analysis(entry)
    except NsysanError:
        return None
    # Found by content: the same bytes may have been analyzed under another name or folder.
    return dataclasses.replace(analysis, source=analysis.source.named(given))


_last_written: tuple[Optional["weakref.ref[Analysis]"], str] = (None, "")


def document_of(analysis: Analysis) -> str:
    """The JSON document of `analysis` (render.json.render_json), not rendered again when it is
    the analysis this process just kept in the cache (batch writes the document it kept)."""
    from ..render.json import render_json

    ref, text = _last_written
    return text if ref is not None and ref() is analysis else render_json(analysis)


def write_entry(entry: Path, analysis: Analysis) -> None:
    """Keep `analysis` at `entry`, whole or not at all (never an error: the cache is a shortcut)."""
    global _last_written
    from ..render.json import render_json

    text = render_json(analysis)
    _last_written = (weakref.ref(analysis), text)
    keep_text(entry, text)


def cached_analysis(path: Path, analyze: Callable[[], Analysis], *, nsys: Any, cache_dir: Optional[Path],
                    options: Mapping[str, Any], content: Optional[str] = None) -> Analysis:
    """The analysis of `path` with `options`: the one kept in the cache, else `analyze()`'s, kept
    for next time. `content`: the input's sha256 when the caller has it already.
    NSYSAN_ANALYSIS_CACHE=0 (or off, no, false) analyzes every time, keeping nothing."""
    if os.environ.get("NSYSAN_ANALYSIS_CACHE", "").strip().lower() in ("0", "off", "no", "false"):
        return analyze()
    try:
        key = analysis_key(content or file_digest(path), options, report_exporter(path, nsys, cache_dir))
        entry = entry_path(cache_dir, key)
    except (OSError, NsysanError):
        return analyze()  # unreadable input or cache: the analysis says what is wrong, if anything
    found = read_entry(entry, path)
    if found is not None:
        return found
    analysis = analyze()
    write_entry(entry, analysis)
    return analysis
