"""Felix's symbolic schedules (Felix §3.2–3.3) on MetaSchedule sketches.

- ``variables``: a sketch's decisions as continuous variables (prime exponents of tile
  factors, log-relaxed categoricals) and ``decode`` back to a valid trace.
- ``tir``: the generic reads of TIR expressions (children, variables, loads) that ``program``,
  ``regions`` and ``gpu`` share.
- ``program``: a scheduled program as ``PerStoreFeature`` sees it — its case (loop structure)
  plus named integer leaves (extents, touched regions, strides, shapes, unroll steps).
- ``regions``: touched-region leaves derived from index expressions with TVM's interval rules.
- ``features``: TVM's 164 per-store features as a torch function of the leaves (exact or
  smooth).
- ``formulas``: closed forms of the leaves in the decisions, fitted by probing.
- ``sketch``: ``SymbolicSketch`` ties them together: ``features(x)`` differentiable in x,
  ``penalties(x)`` for the constraint region.
- ``gpu``: ``VerifyGPUCode``'s checks as differentiable constraints, and a port of them.
- ``verify``: ``gradtune symbolic verify`` against TVM's own extractor.
"""

from .sketch import SymbolicSketch
from .variables import CategoricalVar, SketchVariables, TileVar

__all__ = ["CategoricalVar", "SketchVariables", "SymbolicSketch", "TileVar"]
