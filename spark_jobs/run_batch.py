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

from microbatch.config import find_spec
from microbatch.errors import MicrobatchError, StageFailedError
from microbatch.kafka_offsets import bootstrap_from_env
from microbatch.ledger.database import ledger_url_from_env, unreachable
from microbatch.staging import stage_batches

log = logging.getLogger("microbatch.stage")


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
        stage_batches(spark, spec, batch_ids, ledger_url, bootstrap, log)
        spark.stop()
    except MicrobatchError as exc:
        log.error("stage failed: %s", exc)
        return 1 if exc.retryable else 2
    except OperationalError as exc:
        log.error("stage failed: %s", unreachable(ledger_url, exc))
        return 1
    except Exception as exc:  # outside stage_batches (the session start): the trace, then the one sentence
        log.info("trace of the stage failure:", exc_info=True)
        log.error("stage failed: %s", StageFailedError.from_exception(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
