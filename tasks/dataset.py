"""The stages of ``flows/collect_dataset.py``."""

from prefect import task
from prefect.cache_policies import NO_CACHE

from gradtune.dataset import card, collect

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
dataset_summary = task(card.dataset_summary, name="summarize", cache_policy=NO_CACHE)
