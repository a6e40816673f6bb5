"""Regenerate the report pages' screenshots in docs/ (docs/report.md shows them; the README shows
the first): each page in headless Chromium, 1400 px wide (the first screen) and 420 px wide (the
first two screens).

    python benchmarks/screenshots.py

Each page is written by `nsysan analyze FIXTURE -o DIR` (and `nsysan compare` for the compare
page) into a temporary folder; the PNGs are reduced to 128 colours so git stays light.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from browser import _main as screenshot  # noqa: E402  (tests/ is not a package)

REPORTS = ["torch_leak_v25", "ddp_leak_v25", "real_oom_v25", "known_plain_v25"]
COMPARE = ("torch_clean_v25", "torch_leak_v25")
# The first screen at 1400 px; at 420 px (a phone) two screens, so the plots show under the answer.
SIZES = {1400: 900, 420: 1600}


def nsysan(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "nsysan", *args, "--format", "json"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="nsysan-screens-") as tmp:
        pages = {}
        for name in REPORTS:
            nsysan("analyze", f"fixtures/{name}.sqlite", "-o", f"{tmp}/{name}", "--no-progress")
            pages[f"report-{name}"] = Path(tmp, name, "report.html")
        base, new = COMPARE
        nsysan("compare", f"fixtures/{base}.sqlite", f"fixtures/{new}.sqlite", "-o", f"{tmp}/compare")
        pages[f"compare-{base}-{new}"] = Path(tmp, "compare", "compare.html")
        for stem, page in pages.items():
            for width, height in SIZES.items():
                screenshot([str(page), str(ROOT / "docs" / f"{stem}-{width}.png"), str(width), str(height)])


if __name__ == "__main__":
    main()
