"""gradtune's TenSet-style dataset: programs sampled from MetaSchedule design spaces of the
model zoo's workloads, measured over TVM RPC on this machine, stored as TVM's own JSONDatabase
(gzip'd) beside a manifest and a dataset card, in ``data/`` under DVC.

- ``workloads``: the zoo's tasks, deduplicated into workloads, and the order they are visited.
- ``store``: the files on disk, read back cleaned (``open_dataset``) or opened for appending.
- ``hardware``: the descriptor of the machine that measures (CPU, ISA flags, caches, target).
- ``machines``: which machine measured each record, and which machines pretraining takes.
- ``settings``: what a collection measures per workload, and how.
- ``collect``: sampling, building and measuring into the store, resumable and stoppable.
- ``card``: the manifest, the dataset's summary and its ``README.md``.
- ``versioning``: ``dvc add`` at the end of a collection, ``dvc push`` when asked.

Nothing is re-exported here: import from the module that holds the name.
"""
