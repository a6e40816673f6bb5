"""One style for what an option takes, as --help shows it: FILE, DIR, N, SIZE, and the choices
themselves where there are few ([text|json]). Applied to the whole command tree in cli.py, so a
new option gets it without asking; a metavar an option names itself is kept."""

from __future__ import annotations

from typing import Any

# An option's value by the option's name, where its type alone does not say it.
BY_NAME = {"format": "[text|json]", "per": "[process|gpu|all]", "dask": "local|ADDRESS", "smi_tz": "ZONE",
           "smi_columns": "COLUMNS", "max_peak": "SIZE", "max_never_freed": "SIZE", "max_growth_per_step": "SIZE",
           "max_peak_increase": "PERCENT|SIZE", "no_warnings": "CODES|all", "nsys": "PATH", "output": "DIR",
           "cache_dir": "DIR", "json_dir": "DIR", "baseline": "RUN", "db": "FILE"}


def name_values(command: Any) -> Any:
    """Set the metavar of every option and argument of `command` (a click command, typer's vendored
    click or click itself, hence the duck typing) and its subcommands that has none."""
    for sub in getattr(command, "commands", {}).values():
        name_values(sub)
    for param in command.params:
        if param.metavar or getattr(param, "is_flag", False) or getattr(param, "count", False):
            continue
        kind = type(param.type).__name__
        if param.param_type_name == "argument":
            param.metavar = (param.name or "").upper() + ("..." if param.nargs == -1 else "")
        elif param.name in BY_NAME:
            param.metavar = BY_NAME[param.name]
        elif kind in ("Path", "TyperPath"):
            param.metavar = "FILE"
        elif kind in ("IntRange", "IntParamType"):
            param.metavar = "N"
        else:
            param.metavar = (param.name or "").upper()
    return command
