"""plan or commit one batch in this process, as an Airflow task would, and print BENCH:{json}.

    phase.py plan PIPELINE        -> {"batch_id", "batch_ids" (the run's batches), "records", "seconds"}
    phase.py commit PIPELINE N    -> {"seconds" (commit_batch), "transaction_s" (incl. COMMIT)}
Connections come from MICROBATCH_LEDGER_URL / MICROBATCH_KAFKA_BOOTSTRAP / MICROBATCH_PIPELINES_DIR.
"""

from __future__ import annotations

import json
import sys
import time

STARTED = time.monotonic()

from microbatch import settings  # noqa: E402
from microbatch.config import find_spec  # noqa: E402
from microbatch.ledger.database import Ledger, transaction  # noqa: E402


def main(argv: list[str]) -> int:
    imported = time.monotonic() - STARTED
    what, pipeline = argv[0], argv[1]
    spec = find_spec(pipeline)
    url = settings.ledger_url()
    if what == "plan":
        from microbatch.phases.plan import plan_next_batch

        t0 = time.monotonic()
        outcome = plan_next_batch(spec, Ledger(url), settings.kafka_settings())
        out = {"batch_id": outcome.batch_id, "batch_ids": outcome.batch_ids, "records": outcome.records,
               "ranges": len(outcome.ranges), "seconds": round(time.monotonic() - t0, 4)}
    elif what == "commit":
        from microbatch.phases.commit import commit_batch

        t0 = time.monotonic()
        with transaction(url) as session:
            result = commit_batch(session, spec, int(argv[2]))
        out = {"seconds": round(result.seconds, 4), "transaction_s": round(time.monotonic() - t0, 4),
               "rows_by_sink": result.rows_by_sink}
    else:
        print(__doc__, file=sys.stderr)
        return 2
    out["import_s"] = round(imported, 3)
    print("BENCH:" + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
