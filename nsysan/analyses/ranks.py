"""Ranks: which process of a multi-process job is which.

A rank is read from the process's recorded environment (RANK, LOCAL_RANK, WORLD_SIZE, or the
Open MPI / Slurm / PMI keys; see schema.RANK_KEYS), else numbered by the GPUs the processes hold
memory on: torchrun and mpirun give rank k GPU k unless told otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..model import GroupSummary, Process

# Which key wins for each field, first found first.
_RANK = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
_LOCAL_RANK = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
_WORLD_SIZE = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
# Kinds a process allocates itself; module statics (kernel-image globals) are loaded into every
# context a process opens, even on a GPU it never computes on.
_OWN_KINDS = ("device", "array", "managed")


def gpus_in_use(groups: list[GroupSummary]) -> dict[int, list[int]]:
    """pid -> GPUs (CUDA ordinal when the GPU id is unknown) it allocated memory on itself."""
    used: dict[int, set[int]] = {}
    for group in groups:
        if group.kind in _OWN_KINDS and group.allocations > 0:
            used.setdefault(group.pid, set()).add(group.gpu if group.gpu is not None else group.device)
    return {pid: sorted(gpus) for pid, gpus in used.items()}


def assign_ranks(processes: list[Process], groups: list[GroupSummary],
                 environments: dict[int, dict[str, str]], launched_pids: dict[int, int]) -> list[Process]:
    """The processes with rank, local rank, world size and label filled in.

    `environments` maps PROCESS_<n> of the capture to its rank keys, `launched_pids` to its
    recorded PID (0 when nsys launched it). nsys records only the environment of the process it
    started: it names a rank only when that process (or its only CUDA child) is the one that
    computes; a launcher's (torchrun's) environment names none.
    """
    used = gpus_in_use(groups)
    computing = [p.pid for p in processes if p.pid in used]
    env_of: dict[int, dict[str, str]] = {}
    for index, keys in environments.items():
        pid = launched_pids.get(index, 0)
        if pid in used:
            env_of[pid] = keys
        elif pid == 0 and len(computing) == 1 and len(environments) == 1:
            env_of[computing[0]] = keys  # the launched program, or its only CUDA child
    by_gpu = sorted(computing, key=lambda pid: (used[pid][0], pid))
    result = []
    for proc in processes:
        keys = env_of.get(proc.pid)
        rank = _first(keys, _RANK) if keys else None
        if rank is not None:
            fields = dict(rank=rank, local_rank=_first(keys, _LOCAL_RANK), world_size=_first(keys, _WORLD_SIZE),
                          rank_source="environment")
        elif len(by_gpu) > 1 and proc.pid in by_gpu:
            fields = dict(rank=by_gpu.index(proc.pid), local_rank=None, world_size=None, rank_source="gpu order")
        else:
            fields = dict(rank=None, local_rank=None, world_size=None, rank_source=None)
        label = f"rank {fields['rank']}" if fields["rank"] is not None else f"process {proc.pid}"
        result.append(dataclasses.replace(proc, label=label, **fields))
    return result


def _first(keys: dict[str, str], names: tuple[str, ...]) -> Optional[int]:
    return next((int(keys[name]) for name in names if name in keys), None)
