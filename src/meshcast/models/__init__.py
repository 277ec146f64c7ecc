"""Small reference models that split into pipeline stages (these modules import torch).

- :mod:`meshcast.models.gpt`: a decoder-only transformer (GPT), stages exchange one hidden state.
- :mod:`meshcast.models.utransformer`: a transformer U-Net whose skip connections go from early
  stages to late, non-adjacent ones.

Each file has a config dataclass, the model (deterministic init from a seed), ``split_stages`` and
``stage_graph`` (what each stage receives and sends, as a :class:`meshcast.pipeline.StageGraph`).
"""
