"""Where one `nsysan analyze REPORT --format json` spends its wall time (issue 31):

    python benchmarks/rep_timeline.py OUT.jsonl ROUNDS NSYS REPORT   (with nsysan importable)

Set TIMELINE_SWITCH=SECONDS to try another GIL switch interval (Python's default: 5 ms).
Each round's export cache is cold but holds, after the warm-up round, nsysan's memo of what that
nsys said (`nsys-probes/`, sources/export/nsys_memo.py), as a user's next report with their usual
nsys does; TIMELINE_COLD_MEMO=1 leaves it out (nsys asked again every round).

Each round runs a fresh process (cold export cache) through `child`, which marks, in wall seconds
since the process was launched: nsysan's CLI imported, the imports' thread started and done,
`nsys --version` and the export (from their start to their end), analyze_report and the JSON, and
the exit. The marks are patched around nsysan's own functions; nothing else changes. For every
table, give it an nsys that hides `--tables` (rep_tables_timing.py's every_table_nsys).
Results: docs/performance.md ("Where nsysan's choice spends its time")."""
import json, os, shutil, subprocess, sys, tempfile, time
MEMO_SUBDIR = "nsys-probes"  # nsysan.sources.export.nsys_memo's, not imported: a tree before it has none

def child(launched: float) -> None:
    import threading
    marks = {"python_started": round(time.time() - launched, 4)}
    if os.environ.get("TIMELINE_SWITCH"):  # an experiment: the GIL's switch interval (5 ms by default)
        sys.setswitchinterval(float(os.environ["TIMELINE_SWITCH"]))
        marks["switch_interval_s"] = sys.getswitchinterval()
    def mark(what: str, t0: float | None = None) -> None:
        marks[what] = round(time.time() - launched, 4) if t0 is None else [round(t0 - launched, 4), round(time.time() - launched, 4)]
    sys.argv = ["nsysan", *sys.argv[3:]]
    import nsysan.commands.analyze as A
    import nsysan.sources.export as E
    mark("cli_imported")
    def timed(mod, name, key):
        f = getattr(mod, name)
        def g(*a, **k):
            t0 = time.time(); r = f(*a, **k); mark(key, t0); return r
        setattr(mod, name, g)
    timed(E, "nsys_version", "nsys_version"); timed(E, "_export_into", "nsys_export"); timed(A, "render_json", "render_json")
    real_bg = A._import_in_background
    def bg(*modules):
        mark("imports_started")
        def run():
            import importlib
            quietly = getattr(A, "_import_quietly", None)  # the collector paused, as nsysan's own thread does
            if quietly is not None:
                quietly(*modules)
            else:
                for m in modules:
                    importlib.import_module(m)
            import nsysan.pipeline.stages as S
            timed(S, "analyze_report", "analyze_report")
            mark("imports_done")
        threading.Thread(target=run, daemon=True).start()
    A._import_in_background = bg
    real_exit = os._exit
    def done(code):
        mark("exit"); sys.stderr.write("TIMELINE " + json.dumps(marks) + "\n"); sys.stderr.flush(); real_exit(code)
    os._exit = done
    from nsysan.cli import run
    run()

def main() -> None:
    if len(sys.argv) != 5:
        sys.exit("usage: python benchmarks/rep_timeline.py OUT.jsonl ROUNDS NSYS REPORT")
    out, rounds, nsys, report = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    kept = tempfile.mkdtemp(prefix="timeline-memo-")
    with open(out, "w") as log:
        for r in range(rounds + 1):  # round 0: warm-up
            cache = tempfile.mkdtemp(prefix="timeline-")
            memo_before = r > 0 and not os.environ.get("TIMELINE_COLD_MEMO") and os.path.isdir(os.path.join(kept, MEMO_SUBDIR))
            if memo_before:
                shutil.copytree(os.path.join(kept, MEMO_SUBDIR), os.path.join(cache, MEMO_SUBDIR))
            env = {**os.environ, "NSYSAN_CACHE_DIR": cache, "NSYSAN_ANALYSIS_CACHE": "0"}
            launched = time.time()
            done = subprocess.run([sys.executable, __file__, "--child", str(launched), "analyze", report, "--format", "json",
                                   "--nsys", nsys], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            wall = time.time() - launched
            if r == 0 and os.path.isdir(os.path.join(cache, MEMO_SUBDIR)):
                shutil.copytree(os.path.join(cache, MEMO_SUBDIR), os.path.join(kept, MEMO_SUBDIR))
            line = [l for l in done.stderr.splitlines() if l.startswith("TIMELINE ")]
            row = {"round": r, "rc": done.returncode, "wall_s": round(wall, 4), "nsys_memo_before": memo_before, **(json.loads(line[0][9:]) if line else {"stderr": done.stderr[-300:]})}
            print(json.dumps(row), flush=True)
            if r:
                log.write(json.dumps(row) + "\n")

if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(float(sys.argv[2]))
    else:
        main()
