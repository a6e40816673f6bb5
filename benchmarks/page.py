"""Weight and time to interactive of the report pages (docs/report.md, "Weight and speed").

    flock /tmp/nsysan-bench.lock python benchmarks/page.py [--before DIR]

Writes the pages of the four fixtures, the compare page (torch_clean_v25 -> torch_leak_v25) and,
when benchmarks/data/big_1e6.sqlite exists (benchmarks/make_big_export.py), the page of the
1e6-event export; loads each three times in headless Chromium and prints a Markdown table: the
page's bytes, its data (JSON) bytes and `data-interactive-ms` (navigation start to every panel
drawn and the tables wired) of each load. Limits (issue 12): 2 MB for ddp_leak_v25, 4 MB for the
1e6-event export, interactive under 1 s; issue 29: 1 MB for the 1e6-event export.

With `--before DIR` (a checkout of another nsysan, e.g. `git worktree add --detach DIR COMMIT`),
each page is written by that tree too and the two are loaded in turn in the same browser, so a
busy machine slows both alike: a row per page and tree.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from browser import Chromium  # noqa: E402  (tests/ is not a package)

FIXTURES = ["torch_leak_v25", "ddp_leak_v25", "real_oom_v25", "known_plain_v25"]
BIG = ROOT / "benchmarks" / "data" / "big_1e6.sqlite"
LOADS = 3


def nsysan(tree: Path, *args: str) -> None:
    """`python -m nsysan ARGS` of the checkout `tree` (its package first on the path)."""
    subprocess.run([sys.executable, "-m", "nsysan", *args, "--format", "json"], cwd=tree, check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(tree)})


def write_pages(tree: Path, out: Path) -> dict[str, Path]:
    """The pages of FIXTURES, the compare page and the 1e6-event page as `tree` writes them."""
    pages: dict[str, Path] = {}
    for name in FIXTURES:
        nsysan(tree, "analyze", str(ROOT / "fixtures" / f"{name}.sqlite"), "-o", f"{out}/{name}", "--no-progress")
        pages[f"`{name}`"] = out / name / "report.html"
    nsysan(tree, "compare", str(ROOT / "fixtures" / "torch_clean_v25.sqlite"),
           str(ROOT / "fixtures" / "torch_leak_v25.sqlite"), "-o", f"{out}/compare")
    pages["compare `torch_clean_v25` → `torch_leak_v25`"] = out / "compare" / "compare.html"
    if BIG.exists():
        nsysan(tree, "analyze", str(BIG), "-o", f"{out}/big", "--no-progress")
        pages["1e6-event export (`benchmarks/data/big_1e6.sqlite`)"] = out / "big" / "report.html"
    return pages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="another nsysan checkout to measure in the same run")
    options = parser.parse_args()
    trees = {"this tree": ROOT} | ({f"before ({options.before})": options.before.resolve()} if options.before else {})
    with tempfile.TemporaryDirectory(prefix="nsysan-pages-") as tmp:
        pages = {label: write_pages(tree, Path(tmp, str(n))) for n, (label, tree) in enumerate(trees.items())}
        times: dict[tuple[str, str], list] = {}
        with Chromium() as browser:
            for _ in range(LOADS):  # the trees take turns, load after load
                for label, written in pages.items():
                    for page_label, path in written.items():
                        page = browser.load(path, width=1400, height=900, screenshot=False, evaluate={
                            "ms": "Number(document.documentElement.getAttribute('data-interactive-ms'))"})
                        if page.errors or page.remote_requests:
                            raise SystemExit(f"{label}, {page_label}: {page.errors or page.remote_requests}")
                        times.setdefault((page_label, label), []).append(page.values["ms"])
        print("| page | tree | weight | of which the data (JSON) | interactive (3 loads, ms) |")
        print("|---|---|---:|---:|---|")
        for page_label in next(iter(pages.values())):
            for label, written in pages.items():
                html = written[page_label].read_text(encoding="utf-8")
                data = re.search(r'<script type="application/json" id="[^"]+">(.*?)</script>', html, re.S)
                print(f"| {page_label} | {label} | {len(html.encode()) / 1000:.0f} KB | {len(data.group(1).encode()) / 1000:.0f} KB "
                      f"| {', '.join(str(t) for t in times[page_label, label])} |")


if __name__ == "__main__":
    main()
