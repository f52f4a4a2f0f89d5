"""spark-submit entrypoint of a pipeline's `<pipeline>__maintenance` DAG: each sink with a maintenance schedule
maintains its table (`LakeTable.maintain`); a Delta sink compacts its small files (`OPTIMIZE`), then removes the files
that no retained version needs (`VACUUM ... RETAIN n HOURS`).

Small batches make small files; readers pay for each. Neither step touches the table's log, whose commits
carry each batch's `userMetadata`: `microbatch verify` reads only the log, and for versions older than the
log keeps (Delta's `delta.logRetentionDuration`, 30 days by default) it audits from the ledger's
`lake_commits`, so maintenance never removes what the audit needs.
Exit codes: 0 done, 2 terminal error (do not retry), 1 otherwise.
"""

from __future__ import annotations

import argparse
import logging
import sys

from microbatch.config import decode_spec, find_spec
from microbatch.errors import MicrobatchError, StageFailedError
from microbatch.sinks.registry import maintained
from microbatch.spark_session import build_session

log = logging.getLogger("microbatch.maintenance")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--spec", help="The spec as the task encodes it; default: read the spec file.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        spec = decode_spec(args.spec) if args.spec else find_spec(args.pipeline)
        spark = build_session(f"microbatch-{spec.name}-maintenance")
        for sink in maintained(spec):
            sink.maintain(spark)
        spark.stop()
    except MicrobatchError as exc:
        log.error("maintenance failed: %s", exc)
        return 1 if exc.retryable else 2
    except Exception as exc:
        log.info("trace of the maintenance failure:", exc_info=True)
        log.error("maintenance failed: %s", StageFailedError.from_exception(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
