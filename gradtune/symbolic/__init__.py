"""Felix's symbolic schedules (Felix §3.2) on MetaSchedule sketches.

So far: the variables of a sketch and the decoding of a continuous point into a valid trace
(``variables``). Feature formulas and their verification against ``PerStoreFeature`` are the
rest of issue 3.
"""

from .variables import CategoricalVar, SketchVariables, TileVar

__all__ = ["CategoricalVar", "SketchVariables", "TileVar"]
