"""How an `Analysis` shows itself in a notebook cell: the package puts the view here on import.

The model imports no renderer (tests/test_import_graph.py), so `Analysis._repr_html_` asks here
for the view that the package (`import nsysan`, which knows both) gives. The package used to set
the method on the class, which imported the model with the package: every command then paid the
model's 66 classes before its work could start, and `nsysan analyze` exports meanwhile (issue 31).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

view: Optional[Callable[[Any], str]] = None  # analysis -> HTML; set by nsysan/__init__.py
