"""spark-submit entrypoint of the stage phase: `run_batch.py --pipeline NAME --batch-id N`.

Connections come from the environment (MICROBATCH_LEDGER_URL, MICROBATCH_KAFKA_BOOTSTRAP),
never from the command line, so no secret shows in `ps` or in the task log.
Exit codes: 0 staged (or already committed), 2 terminal error (do not retry), 1 otherwise.
"""

from __future__ import annotations

import argparse
import logging
import sys

from pyspark.sql import SparkSession
from sqlalchemy.exc import OperationalError

from microbatch.config import PipelineSpec, find_spec
from microbatch.errors import DataLossError, MicrobatchError
from microbatch.kafka_offsets import bootstrap_from_env, offset_bounds, offsets_client
from microbatch.ledger import repository as repo
from microbatch.ledger.database import ledger_url_from_env, transaction, unreachable
from microbatch.planning import data_loss_at_read, lost_ranges
from microbatch.reporting import log_stage_summary
from microbatch.staging import stage_batch

log = logging.getLogger("microbatch.stage")


def _is_data_loss(exc: BaseException) -> bool:
    """Whether a Spark (Py4J) failure is the Kafka source's `failOnDataLoss` refusal."""
    text = str(exc)
    return "KAFKA_DATA_LOSS" in text or "failOnDataLoss" in text or "data may have been lost" in text


def _data_loss_error(spec: PipelineSpec, batch_id: int, ledger_url: str, bootstrap: str) -> DataLossError:
    """Spark refused to read offsets that retention deleted after plan: name the lost ranges in one sentence,
    and keep the error on the batch row for `microbatch history`."""
    with transaction(ledger_url) as session:
        ranges = repo.batch_ranges(session, batch_id)
    with offsets_client(bootstrap, spec.source.isolation_level) as consumer:
        earliest, _ = offset_bounds(consumer, sorted({r.tp for r in ranges}))
    error = data_loss_at_read(batch_id, lost_ranges(ranges, earliest) or ranges, spec.source.on_data_loss)
    with transaction(ledger_url) as session:
        repo.record_failure(session, batch_id, str(error))
    return error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--batch-id", required=True, help="A batch id, or several separated by commas.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    ledger_url = ""
    try:
        spec = find_spec(args.pipeline)
        ledger_url = ledger_url_from_env()
        bootstrap = bootstrap_from_env()
        batch_ids = [int(part) for part in str(args.batch_id).split(",") if part.strip()]
        spark = SparkSession.builder.appName(f"microbatch-{spec.name}-batch-{args.batch_id}").getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
        log.info("Spark application id %s (master %s)", spark.sparkContext.applicationId, spark.sparkContext.master)
        for batch_id in batch_ids:
            try:
                result = stage_batch(spark, spec, batch_id, ledger_url, bootstrap)
            except Exception as exc:
                if not _is_data_loss(exc):
                    raise
                raise _data_loss_error(spec, batch_id, ledger_url, bootstrap) from None
            if result is not None:
                log_stage_summary(log, result)
        spark.stop()
    except MicrobatchError as exc:
        log.error("stage failed: %s", exc)
        return 1 if exc.retryable else 2
    except OperationalError as exc:
        log.error("stage failed: %s", unreachable(ledger_url, exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
