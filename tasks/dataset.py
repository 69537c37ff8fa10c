"""The tasks of ``flows/collect_dataset.py``: collect, card, summary (``gradtune.dataset``).

Their input is a dataset directory whose contents change as it is collected; a cache keyed on
the path would return stale results, hence ``NO_CACHE``.
"""

from prefect import task
from prefect.cache_policies import NO_CACHE

from gradtune import dataset

# The collection is resumable through its database: a retry measures only what is missing.
collect_records = task(
    dataset.collect, name="collect", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=10
)
write_card = task(dataset.write_card, name="dataset-card", cache_policy=NO_CACHE)
summarize_dataset = task(dataset.summarize, name="summarize-dataset", cache_policy=NO_CACHE)
