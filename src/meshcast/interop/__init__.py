"""Meeting users where they are: DTensor across meshes, whole state dicts (imports torch).

- :mod:`.dtensor`: ``layout_from_dtensor`` and :func:`reshard_dtensor`;
- :mod:`.state_dict`: :func:`reshard_state_dict`, a whole model in one call;
- :mod:`.weights`: ready layouts of the project's GPT model for weight sync;
- :mod:`.weight_names`: ready name mappings (Llama-style into vLLM-style, the GPT model);
- :mod:`.weight_sync`: :class:`WeightSync`, trainer -> engine every step between two jobs.

Planning many tensors at once (``plan_many``) is :mod:`meshcast.planning.many` (numpy only);
running them (``reshard_many``) is :mod:`meshcast.runtime.many`.
"""

from .dtensor import REDUCTIONS, layout_from_dtensor, reshard_dtensor
from .state_dict import reshard_state_dict
from .sync_spec import ParamSpec
from .weight_names import gpt_mapping, llama_mapping
from .weight_sync import SyncResult, WeightSync, WeightSyncError

__all__ = ["REDUCTIONS", "ParamSpec", "SyncResult", "WeightSync", "WeightSyncError",
           "gpt_mapping", "layout_from_dtensor", "llama_mapping", "reshard_dtensor",
           "reshard_state_dict"]
