"""The tasks of ``flows/collect_dataset.py``: collect, card, summary, DVC versioning
(``gradtune.dataset``).

Their input is a dataset directory whose contents change as it is collected; a cache keyed on
the path would return stale results, hence ``NO_CACHE``.
"""

from prefect import task
from prefect.cache_policies import NO_CACHE

from gradtune.dataset import card, collect, versioning

# The collection is resumable through its database: a retry measures only what is missing.
# A signal does not fail the task (it returns, stopped), so it is never retried after one.
collect_records = task(
    collect.collect_until_signalled,
    name="collect",
    cache_policy=NO_CACHE,
    retries=1,
    retry_delay_seconds=10,
)
write_card = task(card.write_card, name="dataset-card", cache_policy=NO_CACHE)
summarize_dataset = task(card.dataset_summary, name="summarize-dataset", cache_policy=NO_CACHE)
# `dvc add` hashes local files: nothing a retry would change.
add_to_dvc = task(versioning.add_dataset, name="dvc-add", cache_policy=NO_CACHE)
# A push crosses the network to the remote (S3): a dropped connection is worth a retry, and
# DVC uploads only what the remote lacks, so a retry resumes.
push_to_dvc_remote = task(
    versioning.push_dataset,
    name="dvc-push",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=15,
)
