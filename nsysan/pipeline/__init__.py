"""One report in, one `Analysis` out (stages.py: export -> schema -> events -> analyses), the
analyses already made kept by content (cache.py), and what compare, check and batch accept: a
report, an export or an analysis JSON document (report_or_document.py)."""
