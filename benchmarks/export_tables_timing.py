"""Run from the repository root on a machine with nsys 2023.4+ (the GPU machine here): nsys export of one report as nsysan runs it: every table vs --tables with nsysan's current list
(schema.EXPORTED_TABLES, read from the source), 3 rounds taking turns. Usage: NSYS REPORT OUT.json"""
import ast, json, os, re, shutil, sqlite3, subprocess, sys, time

nsys, rep, out = sys.argv[1:4]
src = open("nsysan/sources/schema.py").read()
tables = tuple(re.findall(r"\"([A-Z][A-Za-z_]+)\"", src[src.index("EXPORTED_TABLES = ("):src.index("\n)\n", src.index("EXPORTED_TABLES = ("))]))
base = "/tmp/tt"
def run(extra, name):
    d = f"{base}/{name}"; shutil.rmtree(d, ignore_errors=True); os.makedirs(d)
    cmd = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--include-blobs", "true", *extra,
           "-o", f"{d}/x.sqlite", rep]
    t0 = time.perf_counter(); p = subprocess.run(cmd, capture_output=True, text=True); secs = time.perf_counter() - t0
    names = []
    if os.path.exists(f"{d}/x.sqlite"):
        c = sqlite3.connect(f"{d}/x.sqlite"); names = [r[0] for r in c.execute("select name from sqlite_master where type='table'")]; c.close()
    return {"secs": round(secs, 3), "rc": p.returncode, "bytes": os.path.getsize(f"{d}/x.sqlite") if names else 0,
            "tables": len(names), "missing": [t for t in tables if t not in names], "err": p.stderr[-300:] if p.returncode else ""}
res = {"nsys": subprocess.run([nsys, "--version"], capture_output=True, text=True).stdout.strip(), "report": os.path.basename(rep),
       "tables_asked": list(tables), "cpus": os.cpu_count(), "all": [], "tables": []}
run([], "warm")
for i in range(3):
    res["all"].append(run([], "all"))
    res["tables"].append(run(["--tables", ",".join(tables)], "some"))
med = lambda xs: sorted(x["secs"] for x in xs)[1]
res["median_all_s"], res["median_tables_s"] = med(res["all"]), med(res["tables"])
res["ratio"] = round(res["median_all_s"] / res["median_tables_s"], 2)
json.dump(res, open(out, "w"), indent=1)
print(json.dumps({k: res[k] for k in ("nsys", "median_all_s", "median_tables_s", "ratio")}), res["tables"][0]["missing"], res["all"][0]["bytes"], res["tables"][0]["bytes"])
