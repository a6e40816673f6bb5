"""CUDA memory API names: suffix stripping and families.

The API table stores CUPTI callback names with version suffixes (`cudaMalloc_v3020`,
`cudaMallocAsync_v11020`, `cudaGetDeviceProperties_v2_v12000`) and per-thread-stream variants
(`_ptsz`, `_ptds`). nsys's own scripts strip only 4-digit versions. Matching `cudaMalloc%` or
`cudaFree%` by prefix is wrong: it catches cudaMallocManaged/Host/Async and cudaFreeHost. So
names are stripped, then looked up exactly.
"""

from __future__ import annotations

import re

# Return codes and their names (both enums, whole) live in cuda_errors; re-exported here.
from .cuda_errors import OUT_OF_MEMORY, error_name  # noqa: F401

_SUFFIX = re.compile(r"(?:_v\d+|_pt[sd][zs])+$")


def base_name(api: str) -> str:
    """`cudaMalloc_v3020` -> `cudaMalloc`, `cuMemAllocAsync_ptsz` -> `cuMemAllocAsync`."""
    return _SUFFIX.sub("", api)


ALLOC_APIS = frozenset({
    # device
    "cudaMalloc", "cudaMallocPitch", "cudaMalloc3D", "cudaMallocArray", "cudaMalloc3DArray",
    "cudaMallocMipmappedArray", "cuMemAlloc", "cuMemAllocPitch", "cuArrayCreate", "cuArray3DCreate",
    "cuMipmappedArrayCreate",
    # stream-ordered / pools
    "cudaMallocAsync", "cudaMallocFromPoolAsync", "cuMemAllocAsync", "cuMemAllocFromPoolAsync",
    # managed
    "cudaMallocManaged", "cuMemAllocManaged",
    # pinned host
    "cudaMallocHost", "cudaHostAlloc", "cuMemAllocHost", "cuMemHostAlloc", "cudaHostRegister",
    "cuMemHostRegister",
    # IPC and graph memory nodes
    "cudaIpcOpenMemHandle", "cuIpcOpenMemHandle", "cudaGraphAddMemAllocNode", "cuGraphAddMemAllocNode",
})
FREE_APIS = frozenset({
    "cudaFree", "cudaFreeArray", "cudaFreeMipmappedArray", "cuMemFree", "cuArrayDestroy",
    "cuMipmappedArrayDestroy", "cudaFreeAsync", "cuMemFreeAsync", "cudaFreeHost", "cuMemFreeHost",
    "cudaHostUnregister", "cuMemHostUnregister", "cudaIpcCloseMemHandle", "cuIpcCloseMemHandle",
    "cudaGraphAddMemFreeNode", "cuGraphAddMemFreeNode",
})
# The driver's virtual-memory API (PyTorch expandable segments, NCCL): physical memory is made
# by cuMemCreate and mapped by cuMemMap, but nsys emits the memory events at cuMemSetAccess and
# cuMemUnmap.
VMM_APIS = frozenset({
    "cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease",
    "cuMemAddressFree", "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle",
    "cuMemMapArrayAsync", "cuMemRetainAllocationHandle",
})
POOL_APIS = frozenset({
    "cudaMemPoolCreate", "cudaMemPoolDestroy", "cudaMemPoolTrimTo", "cudaDeviceSetMemPool",
    "cudaMemPoolImportPointer", "cudaMemPoolImportFromShareableHandle", "cuMemPoolCreate",
    "cuMemPoolDestroy", "cuMemPoolTrimTo", "cuDeviceSetMemPool", "cuMemPoolImportPointer",
})
INFO_APIS = frozenset({"cudaMemGetInfo", "cuMemGetInfo"})

FAMILIES = {
    **{a: "alloc" for a in ALLOC_APIS}, **{a: "free" for a in FREE_APIS},
    **{a: "vmm" for a in VMM_APIS}, **{a: "pool" for a in POOL_APIS}, **{a: "info" for a in INFO_APIS},
}


def family(api: str) -> str | None:
    """alloc | free | vmm | pool | info for a memory API (suffix stripped or not), else None."""
    return FAMILIES.get(base_name(api))

