"""A MobileNetV2-like CNN (inverted residuals: 1×1 expand, 3×3 depthwise, 1×1 project,
ReLU6), sized for 32×32 inputs so that it tunes in minutes on two cores. Random weights.

The model lives in ``gradtune.zoo`` (it is also in the dataset's model zoo); this file is the
``gradtune tune examples/mobilenetv2_like.py`` entry point.
"""

from gradtune.zoo import mobilenetv2_like


def get_model(batch: int = 1):
    return mobilenetv2_like(batch)
