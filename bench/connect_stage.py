"""The stage phase in Spark Connect mode, as the Airflow stage task runs it: a Connect client session on a
long-lived server (SPARK_REMOTE=sc://HOST:PORT) and the same staging.stage_batches, so no JVM starts per batch.

    SPARK_REMOTE=sc://127.0.0.1:15002 connect_stage.py PIPELINE BATCH_ID[,BATCH_ID...] [fresh]   -> BENCH:{json}

It reattaches to the server-side session that the pipeline's scheduled DAG shares, as the stage task does; with
`fresh`, it opens a new session instead (and leaves it to the server's idle timeout, as a killed task would).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

STARTED = time.monotonic()

from microbatch import settings  # noqa: E402
from microbatch.config import find_spec  # noqa: E402
from microbatch.ledger.database import Ledger  # noqa: E402
from microbatch.phases.stage import connect_session, stage_batches  # noqa: E402


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING)
    imported = time.monotonic() - STARTED
    spec = find_spec(argv[0])
    t0 = time.monotonic()
    share_key = None if argv[2:] == ["fresh"] else spec.name  # the scheduled DAG's id
    spark = connect_session(os.environ["SPARK_REMOTE"], spec.spark.conf, share_key=share_key)
    connected = time.monotonic() - t0
    t1 = time.monotonic()
    results = stage_batches(spark, spec, [int(b) for b in argv[1].split(",")], Ledger.from_settings(),
                            settings.kafka_settings())
    staged = time.monotonic() - t1
    print("BENCH:" + json.dumps({"import_s": round(imported, 3), "connect_s": round(connected, 3),
                                 "stage_s": round(staged, 3), "records": sum(r.records for r in results),
                                 "timings": results[0].timings if len(results) == 1 else {}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
