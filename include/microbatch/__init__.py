"""microbatch: Airflow-orchestrated Kafka micro-batches with an exactly-once offset ledger."""

__version__ = "0.1.0"
