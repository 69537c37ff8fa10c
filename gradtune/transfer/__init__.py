"""Transfer-tuning (Gibson & Cano): reuse the schedules of models tuned before.

- ``library``: the schedule library, read from run directories and registered models and
  indexed by target, kernel class and workload;
- ``selection``: the paper's Eq. 1, which source model to transfer from;
- ``apply``: a source schedule re-applied to another workload of its kernel class, its tile
  decisions adapted to the new extents;
- ``run``: transfer-only tuning and the warm start of a search, measured over the RPC fleet.
"""
