"""Turn docs/performance.json (written by benchmarks/run.py) into docs/performance.png and the
results table of docs/performance.md (between the RESULTS markers); the scale runs of
docs/scale.json (benchmarks/scale.py, 1e5 to 1e8 events) are drawn on the same axes.

    python benchmarks/report.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DOCS = Path(__file__).resolve().parents[1] / "docs"
BEGIN, END = "<!-- RESULTS BEGIN (benchmarks/report.py) -->", "<!-- RESULTS END -->"


def main() -> None:
    results = json.loads((DOCS / "performance.json").read_text())
    scale_file = DOCS / "scale.json"
    plot(results, DOCS / "performance.png", json.loads(scale_file.read_text()) if scale_file.exists() else {})
    doc = DOCS / "performance.md"
    text = doc.read_text()
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    doc.write_text(text[:start] + "\n" + tables(results) + "\n" + text[stop:])
    print(f"updated {doc} and performance.png")


def tool_names(results: dict) -> list[str]:
    names: list[str] = []
    for row in results["sizes"]:
        names += [n for n in row["tools"] if n not in names]
    return names


MEMORY_FLOOR = "floor, memory table only (sqlite3 shell)"


def tables(results: dict) -> str:
    names = tool_names(results)
    lines = ["| memory events | export | " + " | ".join(names) + " |",
             "|---:|---:|" + "---:|" * len(names)]
    for row in results["sizes"]:
        cells = []
        for name in names:
            r = row["tools"].get(name, {})
            if not r.get("ok"):
                cells.append("failed" if r else "–")
                continue
            ratio = f" (×{r['ratio_to_floor']:.2f})" if "ratio_to_floor" in r else ""
            own_floor = row["tools"].get(MEMORY_FLOOR, {})
            if "--quick" in name and own_floor.get("ok"):  # against the scan of the table it reads
                ratio += f", ×{r['seconds'] / own_floor['seconds']:.2f} of its floor"
            cells.append(f"{r['seconds']:.2f} s{ratio}<br>{r['peak_mib']:.0f} MiB")
        lines.append(f"| {row['events']:,} | {row['file_mib']:.0f} MiB | " + " | ".join(cells) + " |")
    slope = fit(results, "nsysan analyze --format json")
    quick = fit(results, "nsysan analyze --quick --format json")
    floor = fit(results, "floor (sqlite3 shell)")
    out = "\n".join(lines)
    if slope and floor:
        out += (f"\n\nLinear fit of time against events: nsysan {slope[0]:.2f} s per million events "
                f"(+{slope[1]:.2f} s fixed, R² {slope[2]:.4f}); floor {floor[0]:.2f} s per million "
                f"(+{floor[1]:.2f} s, R² {floor[2]:.4f})")
        out += (f"; nsysan --quick {quick[0]:.2f} s per million (+{quick[1]:.2f} s, R² {quick[2]:.4f})."
                if quick else ".")
    if results.get("cache"):
        out += ("\n\n| report (a .nsys-rep / .qdrep) | size | first analysis (runs `nsys export`) | "
                "second analysis (reuses the cache) |\n|---|---:|---:|---:|")
        for c in results["cache"]:
            out += (f"\n| {c['report']} | {c['report_kib']} KiB | {c['first_seconds']:.2f} s | "
                    f"{c['second_seconds']:.2f} s |")
    machine = results["machine"]
    out += (f"\n\nMachine: {machine['cpus']} CPUs, {machine['memory_gib']} GiB, Python {machine['python']}, "
            f"SQLite {machine['sqlite']}, {machine['nsys'] or 'no nsys'}.")
    return out


def fit(results: dict, name: str):
    points = [(row["events"] / 1e6, row["tools"][name]["seconds"]) for row in results["sizes"]
              if row["tools"].get(name, {}).get("ok")]
    if len(points) < 2:
        return None
    x, y = np.array(points).T
    slope, intercept = np.polyfit(x, y, 1)
    predicted = slope * x + intercept
    r2 = 1 - ((y - predicted) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-12)
    return slope, intercept, r2


def plot(results: dict, out: Path, scale: dict) -> None:
    figure = Figure(figsize=(10, 6.2), dpi=110)
    FigureCanvasAgg(figure)
    speed, memory = figure.subplots(1, 2)
    for name in tool_names(results):
        rows = [r for r in results["sizes"] if r["tools"].get(name, {}).get("ok")]
        x = [r["events"] for r in rows]
        speed.plot(x, [r["tools"][name]["seconds"] for r in rows], marker="o", label=name)
        memory.plot(x, [r["tools"][name]["peak_mib"] for r in rows], marker="o", label=name)
    for (label, rows), color in zip(scale.items(), ["tab:gray", "black", "tab:cyan"]):
        for mode, style in (("full", "-"), ("quick", ":")):  # a run that failed is a red cross
            mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["events"])
            done = [r for r in mine if r["ok"]]
            if not mine:
                continue
            name = f"nsysan {'--quick ' if mode == 'quick' else ''}({label}, scale runs)"
            speed.plot([r["events"] for r in done], [r["seconds"] for r in done], style, marker="s", color=color,
                       label=name)
            memory.plot([r["events"] for r in done], [r["peak_mib"] for r in done], style, marker="s", color=color)
            for failed in (r for r in mine if not r["ok"]):
                speed.plot([failed["events"]], [failed["seconds"]], "x", color="red", markersize=9)
                memory.plot([failed["events"]], [failed["peak_mib"]], "x", color="red", markersize=9)
    for axes, label in ((speed, "wall time (s, median)"), (memory, "peak resident memory (MiB)")):
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlabel("memory events in the export")
        axes.set_ylabel(label)
        axes.grid(True, which="both", alpha=0.3)
    for goal, text in ((2.5e9, "2.5 GB goal"), (1e9, "1 GB goal (1e7, issue 14)"), (4e9, "4 GB goal (1e8)")):
        memory.axhline(goal / 2**20, color="grey", linestyle="--", linewidth=1)
        memory.annotate(text, (results["sizes"][0]["events"], goal / 2**20), fontsize=8, color="grey",
                        xytext=(0, 3), textcoords="offset points")
    # below both plots: over the time plot it hid the lines it names
    handles, labels = speed.get_legend_handles_labels()
    figure.legend(handles, labels, fontsize=7, loc="lower center", ncol=2, frameon=False)
    figure.suptitle("nsysan against the floor (a bare sqlite3 scan) and other tools, same files")
    figure.tight_layout(rect=(0, 0.2, 1, 1))
    figure.savefig(out)


if __name__ == "__main__":
    main()
