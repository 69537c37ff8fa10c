"""The DVC pipeline's stage commands (``dvc.yaml``): featurize, pretrain.

Each module is a command line only: it reads its section of ``params.yaml``, calls gradtune's
library (``gradtune.dataset``, ``gradtune.costmodel.featurize``, ``gradtune.costmodel.pretrain``),
prints a one-line result and returns an exit code DVC can act on.
"""
