"""Batch throughput: `nsysan batch` on the local pool and on Dask against `nsysan analyze` run on
the same reports one after another, in one run.

    flock /tmp/nsysan-bench.lock python benchmarks/batch.py            # adds a run to docs/batch-performance.json
    python benchmarks/batch.py --small 50 --large 5 --repeat 1        # a quicker look

Two workloads, each copied (hard links where possible) into a temporary folder:

- small: `--small` copies (200) of fixtures/known_mem_v25.sqlite (300 kB, about 100 memory
  events): what a batch of many short CI captures costs per report;
- large: `--large` copies (20) of benchmarks/data/big_1000000.sqlite (1e6 memory events,
  127 MiB, from make_big_export.py): whether the analyses themselves run in parallel.

For each, four commands, taking turns `--repeat` times, median wall time:

- sequential: `nsysan analyze <every copy> --json-dir D --format json`: one process analyzing one
  report after another (the fair baseline: no process start per report);
- local pool: `nsysan batch <folder> -o D -j <cores>`;
- dask cluster: `nsysan batch <folder> -o D --dask tcp://127.0.0.1:PORT`, on a cluster started
  before the measured runs the way one is in production (`dask scheduler`, then `dask worker
  --nworkers <cores> --nthreads 1`, with the nanny's default settings), its workers warmed by
  importing nsysan once; and the same with `MALLOC_ARENA_MAX=1` in the workers' environment
  ("dask cluster, one arena", as docs/batch.md advises);
- dask local: `nsysan batch <folder> -o D -j <cores> --dask local` (a LocalCluster started and
  stopped inside the measured time); once per round, a separate process also times the stages of
  that fixed cost: importing distributed, starting the cluster, the first task on each worker,
  closing.

Reported: reports per second, per CPU second and CPU seconds per report (the pool's against
sequential's: goal within 1.1x), how busy the cores were (CPU seconds over wall time x jobs: goal
over 90% for the pool), the speed-up of each engine over sequential (goal on the large
exports: at least 0.8 x cores), Dask's overhead over the local pool ((dask - pool) / pool, goal
under 10%), and each command's CPU seconds (all its processes, sampled every 0.1 s: valid under
load, where wall times are not), split into the command's own process, the processes it started
(where the pool's and `--dask local`'s analyses run) and, for a cluster, the cluster's processes
during the run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"


def copies(source: Path, count: int, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    for i in range(count):
        target = folder / f"{source.stem}-{i:03d}{source.suffix}"
        try:
            os.link(source.resolve(), target)
        except OSError:  # another file system
            shutil.copyfile(source, target)
        made.append(target)
    return made


def timed(command: list[str], env: dict, cluster: "ExistingCluster | None" = None) -> tuple[float, dict]:
    """(wall seconds, CPU seconds by part: "command" (its own process), "children" (the
    processes it started: the pool's and `--dask local`'s fork server, nanny and workers) and,
    with a cluster, "cluster scheduler" and "cluster workers" (what they spent during the run))."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # The cluster's scheduler, and its `dask worker` process with the workers it started.
    outside = [p.pid for p in cluster.processes] if cluster else []
    cpu = CpuSampler([proc.pid, *outside])
    _, stderr = proc.communicate()
    seconds = time.perf_counter() - started
    cpu.stop()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} ... failed ({proc.returncode}): {stderr[-500:]}")
    parts = {"command": cpu.seconds(proc.pid, alone=True),
             "children": round(cpu.seconds(proc.pid) - cpu.seconds(proc.pid, alone=True), 2)}
    if outside:
        parts["cluster scheduler"], parts["cluster workers"] = (cpu.seconds(pid) for pid in outside)
    return seconds, parts


class CpuSampler:
    """The CPU seconds of processes and their descendants from the moment it starts, read from
    /proc every 0.1 s in one scan for all of them (a scan costs 2-3 ms of CPU; a process's last
    0.1 s before it exits are missed: a lower bound). The pool's workers are children of the fork
    server, which nobody waits for, so getrusage(RUSAGE_CHILDREN) would not count them."""

    def __init__(self, roots: list[int]) -> None:
        self.roots, self.done = roots, threading.Event()
        self.tick = os.sysconf("SC_CLK_TCK")
        self.owner: dict[int, int] = {}  # pid -> the root it descends from
        self.first = self._sample()  # what the processes already running had spent before
        self.last = dict(self.first)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _sample(self) -> dict[int, float]:
        parents = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as handle:
                        fields = handle.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                parents[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / self.tick)
        owner = {root: root for root in self.roots if root in parents}
        grew = True
        while grew:
            grew = False
            for pid, (parent, _) in parents.items():
                if parent in owner and pid not in owner:
                    owner[pid] = owner[parent]
                    grew = True
        self.owner.update(owner)
        return {pid: parents[pid][1] for pid in owner}

    def _run(self) -> None:
        while not self.done.wait(0.1):
            self.last.update(self._sample())

    def stop(self) -> None:
        self.done.set()
        self.thread.join()

    def seconds(self, root: int, alone: bool = False) -> float:
        """CPU seconds of `root` and its descendants (or of `root` alone)."""
        pids = [root] if alone else [pid for pid, owner in self.owner.items() if owner == root]
        return round(sum(self.last.get(p, 0.0) - self.first.get(p, 0.0) for p in pids), 2)


class ExistingCluster:
    """A Dask scheduler and `jobs` single-threaded workers, started as an operator would (the
    `dask scheduler` and `dask worker` commands, nanny defaults), on the loopback interface.
    Started before each of its measured runs and stopped after it, so that its idle heartbeats
    (a few % of a core) don't run during the other commands' runs."""

    def __init__(self, jobs: int, env: dict, folder: Path, worker_env: dict | None = None) -> None:
        from distributed import Client

        address_file = folder / "scheduler.json"
        address_file.unlink(missing_ok=True)
        quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
        self.processes = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host",
                                            "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file",
                                            str(address_file)], **quiet)]
        try:
            deadline = time.monotonic() + 60
            while not address_file.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            self.processes.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker",
                                                    "--scheduler-file", str(address_file), "--nworkers", str(jobs),
                                                    "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard"],
                                                   **dict(quiet, env=dict(env, **(worker_env or {})))))
            with Client(scheduler_file=str(address_file), timeout="60s") as client:
                client.wait_for_workers(jobs, timeout=120)
                self.address = client.scheduler.address
                client.run(_import_nsysan)  # a cluster in service has, for an earlier batch
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()


# The existing clusters measured, by label: the environment their workers start with besides the
# nanny's defaults. MALLOC_ARENA_MAX=1 is what docs/batch.md advises for workers that run nsysan:
# one malloc arena for every thread, as nsysan's own workers have (nsysan/batch/forkserver_tuning.py).
CLUSTERS = {"dask cluster": {}, "dask cluster, one arena": {"MALLOC_ARENA_MAX": "1"}}


def _import_nsysan() -> None:
    import nsysan.batch.worker  # noqa: F401
    import nsysan.pipeline.stages  # noqa: F401


def dask_local_stages(jobs: int) -> dict:
    """The fixed cost of `--dask local`, stage by stage, in seconds (run in a fresh process)."""
    stages = {}
    lap = time.perf_counter()

    def stage(name: str) -> None:
        nonlocal lap
        now = time.perf_counter()
        stages[name] = round(now - lap, 3)
        lap = now

    import nsysan.cli  # noqa: F401  what the command has imported before it starts Dask

    stage("import nsysan")
    import distributed  # noqa: F401

    stage("import distributed")
    from nsysan.batch import engines, worker

    client, cluster, _ = engines._dask_client("local", jobs)
    stage("start the LocalCluster and connect")
    small = str(ROOT / "fixtures" / "known_mem_v25.sqlite")
    tasks = [client.submit(worker.analyze_some, [small], None, None, 1, worker.TUNE_PROCESS, pure=False,
                           workers=[address]) for address in client.scheduler_info()["workers"]]
    client.gather(tasks)
    stage("first task on each worker (one small report)")
    tasks = [client.submit(worker.analyze_some, [small], None, None, 1, worker.TUNE_PROCESS, pure=False,
                           workers=[address]) for address in client.scheduler_info()["workers"]]
    client.gather(tasks)
    del tasks
    stage("second task on each worker (the same report)")
    client.close()
    cluster.close()
    stage("close")
    return stages


def measure(name: str, reports: list[Path], folder: Path, jobs: int, repeat: int, env: dict,
            with_cluster: bool) -> dict:
    nsysan = [sys.executable, "-m", "nsysan"]
    scratch = Path(tempfile.mkdtemp(prefix=f"nsysan-bench-{name}-"))
    commands = {
        "sequential": nsysan + ["analyze", *map(str, reports), "--json-dir", str(scratch / "seq"), "--format", "json",
                                "--no-progress"],
        "local pool": nsysan + ["batch", str(folder), "-o", str(scratch / "pool"), "-j", str(jobs), "--no-progress"],
        "dask local": nsysan + ["batch", str(folder), "-o", str(scratch / "dask"), "-j", str(jobs), "--dask", "local",
                                "--no-progress"],
    }
    if with_cluster:
        for label in CLUSTERS:
            commands[label] = nsysan + ["batch", str(folder), "-o", str(scratch / "cluster"), "--dask", "ADDRESS",
                                        "--no-progress"]
    times: dict[str, list[float]] = {k: [] for k in commands}
    cpu: dict[str, list[float]] = {k: [] for k in commands}
    cpu_parts: dict[str, list[dict]] = {k: [] for k in commands}
    # The 1-minute load average before each command: on a shared machine it says how many other
    # threads wanted the cores while it ran (an idle 2-core machine shows about 0).
    loads: dict[str, list[float]] = {k: [] for k in commands}
    stages = []
    for round_ in range(repeat):
        for label, command in commands.items():
            (scratch / "seq").mkdir(parents=True, exist_ok=True)
            for out in ("pool", "dask", "cluster"):
                shutil.rmtree(scratch / out, ignore_errors=True)
            cluster = ExistingCluster(jobs, env, scratch, CLUSTERS[label]) if label in CLUSTERS else None
            if cluster is not None:
                command = [cluster.address if arg == "ADDRESS" else arg for arg in command]
            loads[label].append(round(os.getloadavg()[0], 2))
            try:
                seconds, parts = timed(command, env, cluster)
            finally:
                if cluster is not None:
                    cluster.close()
            times[label].append(seconds)
            cpu[label].append(round(parts["command"] + parts["children"], 2))
            cpu_parts[label].append(parts)
            print(f"  {name} {label}: {seconds:.1f} s, {cpu[label][-1]:.1f} CPU s {parts} (round {round_ + 1}, "
                  f"load {loads[label][-1]})", flush=True)
        probe = subprocess.run([sys.executable, __file__, "--dask-local-stages", "--jobs", str(jobs)], cwd=ROOT,
                               env=env, capture_output=True, text=True)
        if probe.returncode == 0:
            stages.append(json.loads(probe.stdout.strip().splitlines()[-1]))
            print(f"  dask local's fixed cost: {stages[-1]}", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    median = {k: statistics.median(v) for k, v in times.items()}
    found = {
        "workload": name, "reports": len(reports), "jobs": jobs, "runs": times, "cpu_s": cpu,
        "cpu_parts_s": cpu_parts, "load_before": loads,
        "median_s": median,
        "reports_per_s": {k: len(reports) / v for k, v in median.items()},
        "speedup_pool": median["sequential"] / median["local pool"],
        "speedup_dask_local": median["sequential"] / median["dask local"],
        "dask_local_overhead": (median["dask local"] - median["local pool"]) / median["local pool"],
        "dask_local_stages_s": stages,
    }
    # Per report and per CPU second (what extrapolates to other machines and batch sizes), and how
    # busy the cores were: the engine's CPU seconds over its wall time times the jobs.
    cpu_median = {k: statistics.median(v) for k, v in cpu.items()}
    found["cpu_median_s"] = cpu_median
    found["cpu_per_report_s"] = {k: v / len(reports) for k, v in cpu_median.items()}
    found["reports_per_cpu_s"] = {k: len(reports) / v for k, v in cpu_median.items() if v}
    found["cpu_vs_sequential"] = {k: v / cpu_median["sequential"] for k, v in cpu_median.items()}
    found["cores_busy"] = {k: cpu_median[k] / (median[k] * jobs) for k in commands}
    if with_cluster:
        found["speedup_dask_cluster"] = median["sequential"] / median["dask cluster"]
        found["dask_cluster_overhead"] = (median["dask cluster"] - median["local pool"]) / median["local pool"]
        found["dask_cluster_one_arena_overhead"] = ((median["dask cluster, one arena"] - median["local pool"])
                                                    / median["local pool"])
    return found


def keep(run: dict, out: Path) -> None:
    """This run in `out`, after the runs already there ({"runs": [...]})."""
    try:
        earlier = json.loads(out.read_text())["runs"]
    except (OSError, ValueError, KeyError, TypeError):
        earlier = []
    runs = [r for r in earlier if r.get("started") != run["started"]] + [run]
    out.write_text(json.dumps({"runs": runs}, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--large", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--only", choices=("small", "large"), help="measure one workload")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "batch-performance.json")
    parser.add_argument("--no-cluster", action="store_true", help="skip the existing-cluster runs")
    parser.add_argument("--dask-local-stages", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dask_local_stages:
        print(json.dumps(dask_local_stages(args.jobs)))
        return
    # Every copy is the same file: with the analysis cache on, a batch would analyze it once and
    # read the rest back (batch reuses analyses; `analyze`, the baseline, does not).
    env = dict(os.environ, PYTHONPATH=str(ROOT), NSYSAN_ANALYSIS_CACHE="0")
    big = DATA / "big_1000000.sqlite"
    if not big.exists():
        raise SystemExit(f"{big} is missing: python benchmarks/make_big_export.py (or link a folder of "
                         "pre-built exports as benchmarks/data)")
    work = Path(tempfile.mkdtemp(prefix="nsysan-batch-bench-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `kill` still removes the copies
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
        results = {"commit": commit, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": {"cores": os.cpu_count(), "jobs": args.jobs,
                                                 "python": platform.python_version(),
                                                 "load_before": os.getloadavg()}, "workloads": []}
        for name, source, count in (("small", ROOT / "fixtures" / "known_mem_v25.sqlite", args.small),
                                    ("large", big, args.large)):
            if args.only and name != args.only:
                continue
            folder = work / name
            reports = copies(source, count, folder)
            results["workloads"].append(measure(name, reports, folder, args.jobs, args.repeat, env,
                                                not args.no_cluster))
            keep(results, args.out)
        results["machine"]["load_after"] = os.getloadavg()
        keep(results, args.out)
        for w in results["workloads"]:
            print(f"{w['workload']}: per report {w['cpu_per_report_s']['local pool']:.3f} CPU s in the pool, "
                  f"{w['cpu_vs_sequential']['local pool']:.3f}x sequential's; cores busy "
                  f"{100 * w['cores_busy']['local pool']:.0f}% (sequential {100 * w['cores_busy']['sequential']:.0f}%); "
                  f"{w['reports_per_cpu_s']['local pool']:.2f} reports per CPU s")
            print(f"{w['workload']}: {w['reports']} reports, sequential {w['median_s']['sequential']:.1f} s, "
                  f"pool {w['median_s']['local pool']:.1f} s ({w['speedup_pool']:.2f}x), dask local "
                  f"{w['median_s']['dask local']:.1f} s ({100 * w['dask_local_overhead']:+.1f}% over the pool)"
                  + (f", dask cluster {w['median_s']['dask cluster']:.1f} s "
                     f"({100 * w['dask_cluster_overhead']:+.1f}% over the pool), one arena "
                     f"{w['median_s']['dask cluster, one arena']:.1f} s "
                     f"({100 * w['dask_cluster_one_arena_overhead']:+.1f}%)" if "dask cluster" in w['median_s']
                     else ""))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
