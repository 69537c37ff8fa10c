"""A DCGAN-like generator: transposed convolutions 1×1 → 4×4 → 8×8 → 16×16 → 32×32 with BN
and ReLU, Tanh output (widths 64–16). Random weights.

The model lives in ``gradtune.zoo`` (it is also in the dataset's model zoo); this file is the
``gradtune tune examples/dcgan_like.py`` entry point.
"""

from gradtune.zoo import dcgan_like


def get_model(batch: int = 1):
    return dcgan_like(batch)
