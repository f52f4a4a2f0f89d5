"""spark-submit entrypoint of the stage phase: `run_batch.py --pipeline NAME --batch-id N [--spec TOKEN]`.

The stage task passes the validated spec itself (`--spec`, see `config.encode_spec`): the driver may
import this package from the `--py-files` zip or run on another machine, where no spec file is. Without
`--spec` (a manual run), the spec is read from the pipelines directory.

Connections come from the environment (MICROBATCH_LEDGER_URL, MICROBATCH_KAFKA_BOOTSTRAP),
never from the command line, so no secret shows in `ps` or in the task log.
Exit codes: 0 staged (or already committed), 2 terminal error (do not retry), 1 otherwise.
"""

from __future__ import annotations

import argparse
import logging
import sys

from sqlalchemy.exc import OperationalError

from microbatch import settings
from microbatch.config import decode_spec, find_spec
from microbatch.errors import MicrobatchError, SpecError, StageFailedError
from microbatch.ledger.database import Ledger, unreachable
from microbatch.phases.kafka_source import quiet_pooled_group_warning
from microbatch.phases.stage import stage_batches
from microbatch.spark_session import build_session

log = logging.getLogger("microbatch.stage")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--batch-id", required=True, help="A batch id, or several separated by commas.")
    parser.add_argument("--spec", help="The spec as the stage task encodes it; default: read the spec file.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    ledger_url = ""
    try:
        spec = decode_spec(args.spec) if args.spec else find_spec(args.pipeline)
        if spec.name != args.pipeline:
            raise SpecError(f"--spec holds the pipeline '{spec.name}', not '{args.pipeline}'.",
                            fix="Pass the spec of the pipeline named by --pipeline.")
        ledger_url = settings.ledger_url()
        kafka = settings.kafka_settings()  # the bootstrap servers and security variables the stage task passed on
        batch_ids = [int(part) for part in str(args.batch_id).split(",") if part.strip()]
        spark = build_session(f"microbatch-{spec.name}-batch-{args.batch_id}")
        quiet_pooled_group_warning(spark)
        log.info("Spark application id %s (master %s)", spark.sparkContext.applicationId, spark.sparkContext.master)
        stage_batches(spark, spec, batch_ids, Ledger(ledger_url), kafka, log)
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
