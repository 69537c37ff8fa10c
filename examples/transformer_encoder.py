"""A small Transformer encoder layer (multi-head self-attention with batch matmuls and
softmax, LayerNorm, GELU MLP): sequence 32, model width 64, 4 heads. Random weights.

The model lives in ``gradtune.zoo`` (it is also in the dataset's model zoo); this file is the
``gradtune tune examples/transformer_encoder.py`` entry point.
"""

from gradtune.zoo import transformer_encoder


def get_model(batch: int = 1):
    return transformer_encoder(batch)
