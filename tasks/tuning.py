"""The stages of ``flows/tune_model.py``."""

from prefect import task
from prefect.cache_policies import NO_CACHE

from gradtune import pipeline

import_model = task(pipeline.import_stage, name="import", cache_policy=NO_CACHE)
partition_model = task(pipeline.partition_stage, name="partition", cache_policy=NO_CACHE)
# Tuning is resumable through its JSONDatabase, so a retry continues rather than restarts;
# the job's --resume flag is what allows writing into the existing directory.
tune_model_tasks = task(pipeline.tune_stage, name="tune", cache_policy=NO_CACHE)
compile_model = task(pipeline.compile_stage, name="compile-verify-time", cache_policy=NO_CACHE)
# A tracking server may blip; registering again is safe (a new run and model version).
report_and_register = task(
    pipeline.report_and_register_stage,
    name="report-register",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=5,
)
