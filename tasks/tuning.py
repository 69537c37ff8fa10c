"""The tasks of ``flows/tune_model.py``: gradtune's tuning stages (``gradtune.pipeline``).

TVM objects (IRModules, executables) flow between these tasks in-process; hashing them for
Prefect's input cache is meaningless, hence ``NO_CACHE``. Each task run is named as its stage:
the run summary's ``stage_seconds`` quotes Prefect's times by those names.
"""

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from gradtune import pipeline

import_model = task(
    pipeline.import_stage, name="import", task_run_name="import", cache_policy=NO_CACHE
)
partition_model = task(
    pipeline.partition_stage, name="partition", task_run_name="partition", cache_policy=NO_CACHE
)
# A tracker or RPC server that drops the connection: the retry resumes from the JSONDatabase
# (measured trials are kept, never measured again).
tune_model_tasks = task(
    pipeline.tune_stage,
    name="tune",
    task_run_name="tune",
    cache_policy=NO_CACHE,
    retries=1,
    retry_delay_seconds=10,
)
compile_model = task(
    pipeline.compile_stage, name="compile", task_run_name="compile", cache_policy=NO_CACHE
)
# A tracking server that blips or restarts: retried after about 4, 8 and 16 s. Retrying is
# safe: a failed attempt leaves no model version, and the next one logs a new run. When all
# fail, the files stay in the output directory for `gradtune register`.
report_and_register = task(
    pipeline.report_and_register_stage,
    name="register",
    task_run_name="register",
    cache_policy=NO_CACHE,
    retries=3,
    retry_delay_seconds=exponential_backoff(backoff_factor=4),
    retry_jitter_factor=0.2,
)
