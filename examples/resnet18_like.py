"""A ResNet-18-like CNN (basic blocks, BN, residuals, stride-2 stages), narrowed to 32×32
inputs and widths 16–64 so that it tunes in minutes on two cores. Random weights.

The model lives in ``gradtune.zoo`` (it is also in the dataset's model zoo); this file is the
``gradtune tune examples/resnet18_like.py`` entry point.
"""

from gradtune.zoo import resnet18_like


def get_model(batch: int = 1):
    return resnet18_like(batch)
