"""Prefect tasks: thin wrappers over gradtune's stage functions (retries, names, no caching).

TVM objects (IRModules, executables) flow between these tasks in-process; hashing them for
Prefect's input cache is meaningless, hence ``NO_CACHE``.
"""
