"""Prefect flows: thin compositions of the tasks in ``tasks/``."""
