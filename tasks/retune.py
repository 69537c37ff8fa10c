"""The tasks of ``flows/retune.py``: fingerprint, registry look-ups, promotion.

Registry calls are retried (a tracking server that blips or restarts): reading a version or
an alias is idempotent, and so is writing the decision's tags and moving the alias. Judging
is not retried: it times the two versions, and a failure there is not a passing fault.
"""

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from gradtune import promotion, retune

_REGISTRY = dict(
    cache_policy=NO_CACHE,
    retries=3,
    retry_delay_seconds=exponential_backoff(backoff_factor=4),
    retry_jitter_factor=0.2,
)

fingerprint = task(retune.fingerprint_stage, name="fingerprint", cache_policy=NO_CACHE)
aliased = task(promotion.aliased, name="registry-alias", **_REGISTRY)
version = task(promotion.version, name="registry-version", **_REGISTRY)
judge = task(promotion.judge, name="judge", cache_policy=NO_CACHE)
record = task(promotion.record, name="record-decision", **_REGISTRY)
