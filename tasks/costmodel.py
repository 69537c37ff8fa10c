"""The tasks of ``flows/pretrain_cost_model.py``: featurize, pretrain, register.

Their inputs are file paths whose contents change between runs; a cache keyed on the paths
would return stale results, hence ``NO_CACHE``.
"""

from prefect import task
from prefect.cache_policies import NO_CACHE

from gradtune.costmodel import featurize, pretrain

featurize_dataset = task(featurize.featurize_dataset, name="featurize", cache_policy=NO_CACHE)
pretrain_weights = task(pretrain.pretrain, name="pretrain", cache_policy=NO_CACHE)
# A tracking server can blip; registering twice is harmless (a new version, alias moved).
register_champion = task(
    pretrain.register_champion,
    name="register-champion",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=5,
)
