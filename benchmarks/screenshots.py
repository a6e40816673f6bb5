"""Regenerate the report pages' screenshots in docs/ (docs/report.md shows them; the README shows
the first): each page in headless Chromium, 1400 px wide (the first screen) and 420 px wide (the
first two screens), then the parts below the first screen that docs/report.md shows (SCENES: the
flame graph with a call stack under the pointer, the click list).

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


# Parts of a page below its first screen, as a reader sees them: the page scrolled to the part
# and the pointer over one of its boxes. name -> (report, width, height, JavaScript run before the shot)
SCENES = {
    # the flame graph of the peak, the pointer over the line that allocated most (its call stack shows)
    "flame-torch_pybt_v25-1400": ("torch_pybt_v25", 1400, 760, """(() => {
      const flame = document.getElementById('flame-main');
      flame.scrollIntoView();
      window.scrollBy(0, -12);
      const box = Array.from(flame.querySelectorAll('.box')).find(b => b.textContent.startsWith('main (torch_train.py:43)'));
      const r = box.getBoundingClientRect();
      box.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + 40, clientY: r.top + 10, bubbles: true}));
      return 'ok';
    })()"""),
    # a click between two peaks: what was live then, the carried allocations and the rest as "other"
    "click-torch_pybt_v25-1400": ("torch_pybt_v25", 1400, 900, """(() => {
      const tl = window.nsysanTimelines[0], data = JSON.parse(document.getElementById('nsysan-data').textContent);
      tl.list((data.livePeaks[0].t - 50e6) / 1e9);
      document.querySelector('#timeline-main .live-list').scrollIntoView();
      window.scrollBy(0, -8);
      return 'ok';
    })()"""),
}


def scene(page: Path, out: Path, width: int, height: int, script: str) -> None:
    """A screenshot of `page` after `script` ran (palette-reduced as browser.py's)."""
    import io

    from browser import open_page
    from PIL import Image

    shot, remote = open_page(page, width=width, height=height, evaluate={"scene": script})
    assert shot.values["scene"] == "ok" and not shot.errors and not remote, (shot.errors, remote)
    image = Image.open(io.BytesIO(shot.screenshot)).convert("RGB")
    image.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    print(f"{out}: {image.size[0]}x{image.size[1]}, {out.stat().st_size} bytes")


def nsysan(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "nsysan", *args, "--format", "json"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="nsysan-screens-") as tmp:
        pages = {}
        scenes = {name: Path(tmp, name, "report.html") for name, *_ in SCENES.values()}
        for name in REPORTS + sorted(set(scenes) - set(REPORTS)):
            nsysan("analyze", f"fixtures/{name}.sqlite", "-o", f"{tmp}/{name}", "--no-progress")
            if name in REPORTS:
                pages[f"report-{name}"] = Path(tmp, name, "report.html")
        base, new = COMPARE
        nsysan("compare", f"fixtures/{base}.sqlite", f"fixtures/{new}.sqlite", "-o", f"{tmp}/compare")
        pages[f"compare-{base}-{new}"] = Path(tmp, "compare", "compare.html")
        for stem, page in pages.items():
            for width, height in SIZES.items():
                screenshot([str(page), str(ROOT / "docs" / f"{stem}-{width}.png"), str(width), str(height)])
        for stem, (name, width, height, script) in SCENES.items():
            scene(scenes[name], ROOT / "docs" / f"{stem}.png", width, height, script)


if __name__ == "__main__":
    main()
