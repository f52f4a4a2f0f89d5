"""spark-submit entrypoint of a pipeline's `<pipeline>__maintenance` DAG: compact each Delta sink's small files
(`OPTIMIZE`), then remove the files that no retained version needs (`VACUUM ... RETAIN n HOURS`).

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
import time

from pyspark.sql import SparkSession

from microbatch.config import DeltaSink, decode_spec, find_spec
from microbatch.errors import MicrobatchError, StageFailedError
from microbatch.sinks import delta

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
        spark = SparkSession.builder.appName(f"microbatch-{spec.name}-maintenance").getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
        for sink in spec.lake_sinks:
            maintain(spark, sink)
        spark.stop()
    except MicrobatchError as exc:
        log.error("maintenance failed: %s", exc)
        return 1 if exc.retryable else 2
    except Exception as exc:
        log.info("trace of the maintenance failure:", exc_info=True)
        log.error("maintenance failed: %s", StageFailedError.from_exception(exc))
        return 1
    return 0


def maintain(spark: SparkSession, sink: DeltaSink) -> None:
    loc = delta.location(sink)
    before = _files(spark, loc)
    started = time.monotonic()
    optimized = spark.sql(f"OPTIMIZE delta.`{loc}`").collect()
    metrics = optimized[0]["metrics"] if optimized else None
    compacted = time.monotonic() - started
    after = _files(spark, loc)
    log.info("%s: OPTIMIZE %s: %s files -> %s files (%s removed, %s added) in %.1fs", sink.name, loc, before, after,
             getattr(metrics, "numFilesRemoved", "?"), getattr(metrics, "numFilesAdded", "?"), compacted)
    started = time.monotonic()
    # A retention below Delta's 7-day floor needs its safety check off, as Delta's own docs say.
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled",
                   "false" if sink.maintenance.retain_hours < 168 else "true")
    spark.sql(f"VACUUM delta.`{loc}` RETAIN {int(sink.maintenance.retain_hours)} HOURS").collect()
    log.info("%s: VACUUM %s retaining %s hours in %.1fs", sink.name, loc, sink.maintenance.retain_hours,
             time.monotonic() - started)


def _files(spark: SparkSession, loc: str) -> int:
    return int(spark.sql(f"DESCRIBE DETAIL delta.`{loc}`").collect()[0]["numFiles"])


if __name__ == "__main__":
    sys.exit(main())
