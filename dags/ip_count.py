"""Airflow DAG of the `ip_count` pipeline. Thin on purpose: the spec and the factory do the work.

One file per pipeline, so a bad spec is an import error of its own DAG only.
"""

from microbatch.airflow.dags import backfill_dag, maintenance_dag, pipeline_dag

dag = pipeline_dag("ip_count")
backfill = backfill_dag("ip_count")
maintenance = maintenance_dag("ip_count")  # None until the spec has a lakehouse sink
