"""torch.distributed's gather into one tensor and reduce-scatter of one tensor, under the names of the
torch in use: torch 2.13 named them ``all_gather_single`` and ``reduce_scatter_single``, and the
older ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` warn there (FutureWarning). tilecomm's
own tools (bench, demo, tune's GPU points) call these; both names reach the same backend operation."""

import torch.distributed as dist

all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
