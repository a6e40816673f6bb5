"""Which frame of a call stack is "the caller": the rules that skip the machinery.

A native stack (`--cudabacktrace`) runs from the CUDA driver up through the runtime, PyTorch's
caching allocator, ATen and its dispatcher, the Python interpreter and libc's start-up, and only
somewhere in between (or nowhere) through the user's own code. A Python stack
(`--python-backtrace=cuda`) runs from a framework's module up to the user's script. The rules here
pick the frame that answers "which line of my code allocated this?", and a label when no frame
does. They work on one row per frame, innermost first, so each rule is one vectorized test.
"""

from __future__ import annotations

import html
import re
from pathlib import PurePosixPath

import numpy as np
import pandas as pd

# --- native frames -------------------------------------------------------------------------

# Modules that are never the caller: the profiler's injection, the CUDA libraries (driver,
# runtime, cuBLAS, cuDNN, NCCL), PyTorch's own libraries, the interpreter (`/usr/bin/python3.12`,
# `libpython3.12.so`), the dynamic loader, libc and the C++ runtime.
NATIVE_MACHINERY_MODULES = re.compile(
    r"libcupti|libcuda\.so|libcudart|libToolsInjection|libnvToolsExt|libnvtx|libcublas|libcudnn|"
    r"libnccl|libc10|libtorch|libcaffe2|libpython|(?:^|/)python[\d.]*[mdu]?$|ld-linux|(?:^|/)libc\.so|"
    r"libstdc\+\+|libgcc_s", re.I)
# Symbols that are never the caller: CUDA API entry points and their C++ templates, the
# allocator/framework namespaces (PyTorch, Caffe2, c10d, NCCL, cuBLAS, cuDNN), CPython's
# interpreter (`_PyEval_EvalFrameDefault`, `Py_RunMain`, `PyObject_Vectorcall`, `pymain_run_python`),
# libc start-up and unresolved addresses.
NATIVE_MACHINERY_SYMBOLS = re.compile(
    r"^(cu[A-Z]\w*|cuda[A-Z]\w*|cudaError(_t)? cuda\w*|__cuda|cudart::|"
    r"c10::|c10d::|at::|torch::|caffe2::|nccl\w*|cublas\w*|cudnn\w*|"
    r"_Py|Py[A-Z_]|pymain_|"
    r"__libc_start|_start$|_dl_start|std::|0x[0-9a-fA-F]+$)")
# The frames a framework-only stack is labelled by: the ATen function that allocated and the
# operator that asked for it (`at::native::empty_cuda <- at::_ops::addmm::call`).
_ATEN_ALLOCATING = re.compile(r"^at::(native|detail)::")
_ATEN_OPERATOR_CALL = re.compile(r"^at::_ops::\w+::call$")


def native_machinery(symbols: pd.Series, modules: pd.Series, unresolved: np.ndarray) -> np.ndarray:
    """Per frame: True when it belongs to the machinery between the user's code and the GPU."""
    return (modules.str.contains(NATIVE_MACHINERY_MODULES).to_numpy()
            | symbols.str.match(NATIVE_MACHINERY_SYMBOLS).to_numpy() | unresolved)


def operator_label(functions: list[str]) -> str:
    """Label of a stack that is machinery all the way (functions innermost first, short names).

    Names the ATen function that allocated and the outermost operator call above it, never the
    interpreter's main; "" when the stack has neither (no framework in it).
    """
    inner = without_templates(next((f for f in functions if _ATEN_ALLOCATING.match(f)), ""))
    outer = next((f for f in reversed(functions) if _ATEN_OPERATOR_CALL.match(f)), "")
    if inner and outer:
        return f"{inner} ← {outer}"
    return inner or outer


def without_templates(name: str) -> str:
    """`at::native::gpu_reduce_kernel<float, ...>` -> `at::native::gpu_reduce_kernel` (also when
    the symbol was cut short inside its template arguments)."""
    out, depth = [], 0
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def short_function(symbol: str) -> str:
    """`alloc_weights(unsigned long)` -> `alloc_weights`; `ns::f<int>(x) const` -> `ns::f<int>`."""
    # "(anonymous namespace)" is part of a name, not its parameter list
    symbol = symbol.replace("(anonymous namespace)", "{anonymous}")
    depth, cut = 0, len(symbol)
    for i, ch in enumerate(symbol):
        if ch in "<[":
            depth += 1
        elif ch in ">]":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and i > 0:
            cut = i
            break
    name = symbol[:cut].strip()
    # Drop a leading return type ("cudaError cudaMalloc<char>") at template depth 0.
    depth, last_space = 0, -1
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == " " and depth == 0:
            last_space = i
    name = name[last_space + 1:] if last_space >= 0 else name
    return name.replace("{anonymous}", "(anonymous namespace)")


def module_name(path: str) -> str:
    return PurePosixPath(path).name if path else ""


# --- Python frames -------------------------------------------------------------------------

# Files that are not the user's code: installed packages, the standard library
# (`/usr/lib/python3.12/`, `<venv>/lib/python3.12/`), frozen modules (`<frozen runpy>`).
_NOT_USER_FILE = re.compile(r"[/\\](site|dist)-packages[/\\]|[/\\]lib[/\\]python\d[\d.]*[/\\]|^<frozen ")


def is_user_file(path: str) -> bool:
    """Whether a Python source file is the user's own code (not a package, the stdlib, frozen)."""
    return bool(path) and not _NOT_USER_FILE.search(path)


def python_function(recorded: str) -> str:
    # nsys stores `<module>` as `&lt;module&gt;`
    return html.unescape(recorded)


def python_site_frame(files: list[str]) -> int:
    """Index (innermost first) of the frame that names a Python stack's site: the innermost frame
    in the user's code; without one, the innermost frame outside the stdlib and frozen modules;
    else the innermost frame."""
    for i, path in enumerate(files):
        if is_user_file(path):
            return i
    for i, path in enumerate(files):
        if path and not re.search(r"[/\\]lib[/\\]python\d[\d.]*[/\\](?!(site|dist)-packages)|^<frozen ", path):
            return i
    return 0


def python_context_frame(functions: list[str], site: int) -> int:
    """Index of the frame shown under a Python site: the nearest frame it called whose function is
    public (`to`, `forward`), past the wrappers in between (`_wrapped_call_impl`, `_call_impl`);
    -1 when the site is the innermost frame."""
    return next((i for i in range(site - 1, -1, -1) if not functions[i].startswith("_")), site - 1)
