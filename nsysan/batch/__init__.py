"""`nsysan batch`: many reports analyzed in parallel (a local process pool or a Dask cluster),
gathered into a summary (CSV, HTML, fleet view) and a SQLite database.

    report_paths.py  folders, globs and @list files -> the report paths
    worker.py        analyze_one(path) on a worker -> the JSON document or the one-line error
    engines.py       the local pool and Dask, each with a bounded number of analyses in flight
    orchestrate.py   run_batch: each result kept whole as it comes (document, database rows)
    summary.py       one row per report x process/GPU, and the fleet view across ranks
    database.py      nsysan.db written with sqlite-utils
"""
