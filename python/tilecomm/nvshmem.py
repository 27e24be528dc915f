"""NVSHMEM for CUDA tensors: where its host library is, and tensors on its symmetric heap.

tilecomm loads NVSHMEM's host library at run time (the ``nvidia-nvshmem-cu13``
wheel, or ``$NVSHMEM_HOME/lib``) and initialises it once per process, the first
time a group needs it (an NVSHMEM all_gather or reduce_scatter, or
``symmetric_empty``); that group's rank r becomes PE r. An application that
initialised NVSHMEM itself first (nvshmem4py's ``nvshmem.core.init``, PE r on
rank r) keeps that initialisation, and its heap tensors (``nvshmem.core.tensor``)
are used in place like ``symmetric_empty``'s. Where the library is
missing or fails to initialise, the NVSHMEM algorithms are not offered and
CUDA all_gather / reduce_scatter stay as they were (a forced one raises).
"""

from __future__ import annotations

import os

LIBRARY = "libnvshmem_host.so.3"


def _package_roots() -> list[str]:
    """The folders of the nvidia-nvshmem wheel's package, if installed."""
    try:
        import nvidia.nvshmem  # noqa: PLC0415
    except ImportError:
        return []
    return list(nvidia.nvshmem.__path__)


def library() -> tuple[str, str]:
    """(path of NVSHMEM's host library, "") or ("", why it is not offered)."""
    roots = [os.environ["NVSHMEM_HOME"]] if os.environ.get("NVSHMEM_HOME") else []
    for root in roots + _package_roots():
        path = os.path.join(root, "lib", LIBRARY)
        if os.path.isfile(path):
            return path, ""
    return "", f"{LIBRARY} not found (pip install nvidia-nvshmem-cu13, or set NVSHMEM_HOME)"


def offered(cfg: dict, one_domain: bool, built: bool) -> tuple[str, str]:
    """(library path, "") when a group with settings `cfg` offers the NVSHMEM algorithms, else ("", why)."""
    if not built:
        return "", "tilecomm was built without the NVSHMEM headers"
    if cfg["TILECOMM_NVSHMEM"] == "off":
        return "", "TILECOMM_NVSHMEM=off"
    if not one_domain:
        return "", "the group spans several hosts"
    return library()


def symmetric_empty(*size, dtype=None, device=None, group=None):
    """An uninitialised CUDA tensor on NVSHMEM's symmetric heap, which the NVSHMEM algorithms use in
    place instead of staging it: pull kernels read such an input where it lies, all_gather push
    stores into such an output (all_gather_into_tensor, or a list of consecutive blocks of one), and
    the all_reduce two-shot (TILECOMM_CUDA_ALLREDUCE=nvshmem_two_shot) reads and writes such a tensor.

    Collective: every rank of ``group`` (default: the world group; a tilecomm group with CUDA) calls it
    with the same size, in the same order relative to the group's operations. The memory is never
    returned to the heap before the process exits (NVSHMEM's free is collective too): allocate
    long-lived buffers. Raises ValueError where NVSHMEM is not available, saying why.
    """
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    dtype = dtype or torch.get_default_dtype()
    device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    pg = group if group is not None else dist.group.WORLD
    if pg is None:
        raise ValueError("tilecomm.symmetric_empty: no process group (call init_process_group first)")
    try:
        be = pg._get_backend(torch.device("cuda"))
    except RuntimeError:
        be = None
    if not hasattr(be, "symmetric_empty"):
        raise ValueError("tilecomm.symmetric_empty: the group has no tilecomm backend for CUDA tensors")
    return be.symmetric_empty([int(s) for s in size], dtype, device)


def fcollect(out, inp) -> None:
    """NVSHMEM's own fcollect over every PE, on the current stream (for comparisons in benchmarks):
    ``out`` (PEs x ``inp``) and ``inp`` must be symmetric tensors."""
    from tilecomm import _C  # noqa: PLC0415

    _C.nvshmem_fcollect(out, inp)


def sum_reduce(out, inp) -> None:
    """NVSHMEM's own float32 sum reduction over every PE, on the current stream (for comparisons in
    benchmarks): ``out`` and ``inp``, of one size, must be symmetric tensors."""
    from tilecomm import _C  # noqa: PLC0415

    _C.nvshmem_sum_reduce(out, inp)
