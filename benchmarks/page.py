"""Weight and time to interactive of the report pages (docs/report.md, "Weight and speed").

    flock /tmp/nsysan-bench.lock python benchmarks/page.py

Writes the pages of the four fixtures, the compare page (torch_clean_v25 -> torch_leak_v25) and,
when benchmarks/data/big_1e6.sqlite exists (benchmarks/make_big_export.py), the page of the
1e6-event export; loads each three times in headless Chromium and prints a Markdown table: the
page's bytes, its data (JSON) bytes and `data-interactive-ms` (navigation start to every panel
drawn and the tables wired) of each load. Limits (issue 12): 2 MB for ddp_leak_v25, 4 MB for the
1e6-event export, interactive under 1 s.
"""

from __future__ import annotations

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


def nsysan(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "nsysan", *args, "--format", "json"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="nsysan-pages-") as tmp:
        pages: dict[str, Path] = {}
        for name in FIXTURES:
            nsysan("analyze", f"fixtures/{name}.sqlite", "-o", f"{tmp}/{name}", "--no-progress")
            pages[f"`{name}`"] = Path(tmp, name, "report.html")
        nsysan("compare", "fixtures/torch_clean_v25.sqlite", "fixtures/torch_leak_v25.sqlite", "-o", f"{tmp}/compare")
        pages["compare `torch_clean_v25` → `torch_leak_v25`"] = Path(tmp, "compare", "compare.html")
        if BIG.exists():
            nsysan("analyze", str(BIG), "-o", f"{tmp}/big", "--no-progress")
            pages["1e6-event export (`benchmarks/data/big_1e6.sqlite`)"] = Path(tmp, "big", "report.html")
        print("| page | weight | of which the data (JSON) | interactive (3 loads, ms) |")
        print("|---|---:|---:|---|")
        with Chromium() as browser:
            for label, path in pages.items():
                html = path.read_text(encoding="utf-8")
                data = re.search(r'<script type="application/json" id="[^"]+">(.*?)</script>', html, re.S)
                times = []
                for _ in range(LOADS):
                    page = browser.load(path, width=1400, height=900, screenshot=False, evaluate={
                        "ms": "Number(document.documentElement.getAttribute('data-interactive-ms'))"})
                    if page.errors or page.remote_requests:
                        raise SystemExit(f"{label}: {page.errors or page.remote_requests}")
                    times.append(page.values["ms"])
                print(f"| {label} | {len(html.encode()) / 1000:.0f} KB | {len(data.group(1).encode()) / 1000:.0f} KB "
                      f"| {', '.join(str(t) for t in times)} |")


if __name__ == "__main__":
    main()
