"""tilecomm: a collective-communication backend for torch.distributed.

``import tilecomm`` registers the backend ``"tilecomm"`` so that
``dist.init_process_group("tilecomm")`` works.
"""

__version__ = "0.1.0"

from tilecomm import ops  # noqa: E402
from tilecomm._backend import register as _register  # noqa: E402
from tilecomm.host_stages import host_stages  # noqa: E402
from tilecomm.nvshmem import symmetric_empty  # noqa: E402
from tilecomm.topology import Topology, gpu_topology, stats, topology  # noqa: E402

_register()

__all__ = ["Topology", "gpu_topology", "host_stages", "ops", "stats", "symmetric_empty", "topology", "__version__"]
