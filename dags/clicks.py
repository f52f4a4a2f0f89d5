"""Airflow DAG of the `clicks` pipeline. Thin on purpose: the spec and the factory do the work.

One file per pipeline, so a bad spec is an import error of its own DAG only.
"""

from microbatch.airflow.dags import backfill_dag, maintenance_dag, pipeline_dag

dag = pipeline_dag("clicks")
backfill = backfill_dag("clicks")
maintenance = maintenance_dag("clicks")  # compacts and vacuums its Delta table
