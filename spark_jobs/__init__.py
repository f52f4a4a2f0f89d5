"""Spark entrypoints (`run_batch.py`) and the pure DataFrame transforms of the pipelines."""
