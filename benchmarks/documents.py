"""Compare the JSON documents of two checkouts (before / after a change) byte for byte.

    python benchmarks/documents.py --before /work/wt-base --after . [benchmarks/data/big_1e6.sqlite ...]

For every fixtures/*.sqlite of the --after checkout, every export of ../shared/corpus (found as
tests/test_corpus.py finds them; reports that need an nsys newer than the local one end in one
clear error, which is compared too) and the exports named on the command line, each checkout
writes `nsysan analyze X --format json` twice: as the command line runs it (the whole frame when it
fits) and with `--max-memory 0` (forced streaming, many small batches). The four documents of an
input are compared: before against after on each path, and the two paths against each other
(reported apart: a difference between paths that was there before is not the change's).

Nothing is ignored: the document names the input by the path given, which is the same for both
checkouts, and holds no time of the run. The analysis cache is off (NSYSAN_ANALYSIS_CACHE=0), so
that every document is computed by the checkout under test; exports of reports are shared through
one cache directory (the export is not what is compared), each report exported once before
the documents are made, so that every document says `from_cache: true` alike. Exit status 1 when any document differs.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import difflib
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = {"default": [], "streamed": ["--max-memory", "0"]}
WARM = {"quick": ["--quick"]}  # what exports the reports once, before the documents


def inputs(checkout: Path, extra: list[Path]) -> list[Path]:
    """The fixtures, the corpus exports and the extra exports, in a stable order."""
    found = sorted((checkout / "fixtures").glob("*.sqlite"))
    corpus = (checkout / ".." / "shared" / "corpus").resolve()
    if corpus.is_dir():
        found += sorted(p for p in corpus.glob("*/*") if p.suffix in (".sqlite", ".nsys-rep", ".qdrep"))
    return [p.resolve() for p in found] + [p.resolve() for p in extra]


def document(checkout: Path, export: Path, mode: str, cache: Path) -> bytes:
    """What `nsysan analyze` of `checkout` writes for `export`: stdout, or the exit status and
    stderr when it fails (a clear error is an answer to compare as well)."""
    env = dict(os.environ, PYTHONPATH=str(checkout.resolve()), NSYSAN_ANALYSIS_CACHE="0")
    result = subprocess.run([sys.executable, "-m", "nsysan", "analyze", str(export), "--format", "json",
                             "--no-progress", "--cache-dir", str(cache), *{**MODES, **WARM}[mode]],
                            env=env, capture_output=True, cwd=checkout, timeout=3600)
    if result.returncode:
        return b"exit %d\n" % result.returncode + result.stderr
    return result.stdout


def first_difference(a: bytes, b: bytes, lines: int = 6) -> str:
    diff = difflib.unified_diff(a.decode(errors="replace").splitlines(), b.decode(errors="replace").splitlines(),
                                "before", "after", n=1, lineterm="")
    return "\n".join(list(diff)[:lines * 3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("exports", nargs="*", type=Path, help="more exports (e.g. make_big_export.py's)")
    parser.add_argument("--before", type=Path, required=True, help="checkout without the change")
    parser.add_argument("--after", type=Path, required=True, help="checkout with the change")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", help="only inputs whose path contains this")
    parser.add_argument("--keep", type=Path, help="write every document here (<checkout>/<mode>/<name>.json)")
    args = parser.parse_args()
    todo = [p for p in inputs(args.after, args.exports) if not args.only or args.only in str(p)]
    checkouts = {"before": args.before, "after": args.after}
    with tempfile.TemporaryDirectory(prefix="nsysan-documents-") as cache:
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            # every report exported once first: each document then says from_cache true alike
            reports = [p for p in todo if p.suffix != ".sqlite"]
            list(pool.map(lambda p: document(args.after, p, "quick", Path(cache)), reports))
            futures = {(export, name, mode): pool.submit(document, checkout, export, mode, Path(cache))
                       for export in todo for name, checkout in checkouts.items() for mode in MODES}
            docs = {key: future.result() for key, future in futures.items()}
    changed = 0
    for export in todo:
        label = export.name if export.is_relative_to(args.after.resolve()) else str(export)
        for mode in MODES:
            before, after = docs[(export, "before", mode)], docs[(export, "after", mode)]
            if args.keep:
                for name, text in (("before", before), ("after", after)):
                    out = args.keep / name / mode / f"{export.parent.name}__{export.name}.json"
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(text)
            if before != after:
                changed += 1
                print(f"DIFFERENT {mode:8s} {label}\n{first_difference(before, after)}")
        paths_before = docs[(export, "before", "default")] == docs[(export, "before", "streamed")]
        paths_after = docs[(export, "after", "default")] == docs[(export, "after", "streamed")]
        if paths_after != paths_before or not paths_after:
            print(f"paths {'equal' if paths_after else 'DIFFER'} after, {'equal' if paths_before else 'differ'}"
                  f" before: {label}")
        digest = hashlib.sha256(docs[(export, "after", "default")]).hexdigest()[:12]
        failed = docs[(export, "after", "default")].startswith(b"exit ")
        print(f"{'error' if failed else 'ok':5s} {digest} {label}")
    total = len(todo) * len(MODES)
    print(f"{total - changed} of {total} documents identical ({len(todo)} inputs x {len(MODES)} paths)")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
