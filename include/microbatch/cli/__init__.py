"""The `microbatch` operator CLI (Typer + Rich).

Every command finds its connections the same way: the environment first, else the local stack that
`make demo` or `make airflow` started. Every error is one sentence on the cause and the fix, and a
non-zero exit; no traceback. The commands that run a DAG (`run`, `backfill`, `maintain`, `demo`) print one
line per DAG run and a failed run's cause; Airflow's and the tasks' log lines go to a file.

`entry.py` holds the Typer `app` and `main`; one module per group of commands: `pipelines.py`, `ledger_views.py`,
`ledger_repairs.py`, `deadletters.py`, `local_stack.py`; beneath them `dag_runs.py` (a DAG run's lines on the
terminal), `sentences.py` (an error's one sentence) and `common.py` (what they share). This package re-exports
their names, as the one module `cli.py` had them.
"""

from microbatch.cli.common import (
    JsonFlag,
    LogFile,
    _bootstrap,
    _fail,
    _kafka,
    _ledger,
    _ledger_url,
    _partitions_param,
    _pipeline_id,
    _print_rows,
    _quiet_clients,
    _run_log_path,
    console,
)
from microbatch.cli.dag_runs import (
    DRIVER_ERROR,
    _dag_runs,
    _ErrorLines,
    _log_for,
    _masked,
    _no_cause,
    _output_to,
    _run_line,
    run_cause,
)
from microbatch.cli.deadletters import (
    BatchFilter,
    PartitionFilter,
    ReasonFilter,
    SinceFilter,
    TopicFilter,
    UntilFilter,
    _dead_letters,
    _preview,
    dead_letters,
    reprocess,
)
from microbatch.cli.entry import app, main
from microbatch.cli.ledger_repairs import _reland_session, _reset_watermark, abandon, reland, reset
from microbatch.cli.ledger_views import (
    _latest_offsets,
    _runs_text,
    _show_lake,
    _show_published,
    _show_table,
    find,
    history,
    metrics,
    show,
    state,
    status,
    verify,
)
from microbatch.cli.local_stack import (
    _create_output_topics,
    _generate_clicks,
    _run_demo_dag,
    _start_connect_server,
    airflow,
    demo,
)
from microbatch.cli.pipelines import (
    _latest_avro_schema,
    _migrate_topics,
    _new_from_topic,
    backfill,
    generate,
    maintain,
    migrate,
    new,
    publish,
    run,
    schema,
)
from microbatch.cli.sentences import _print_error, _sentence, _unexpected, airflow_metadata_error
from microbatch.dev import localenv

__all__ = [
    "DRIVER_ERROR", "BatchFilter", "JsonFlag", "LogFile", "PartitionFilter", "ReasonFilter", "SinceFilter",
    "TopicFilter", "UntilFilter", "_ErrorLines", "_bootstrap", "_create_output_topics", "_dag_runs", "_dead_letters",
    "_fail", "_generate_clicks", "_kafka", "_latest_avro_schema", "_latest_offsets", "_ledger", "_ledger_url",
    "_log_for", "_masked", "_migrate_topics", "_new_from_topic", "_no_cause", "_output_to", "_partitions_param",
    "_pipeline_id", "_preview", "_print_error", "_print_rows", "_quiet_clients", "_reland_session", "_reset_watermark",
    "_run_demo_dag", "_run_line", "_run_log_path", "_runs_text", "_sentence", "_show_lake", "_show_published",
    "_show_table", "_start_connect_server", "_unexpected", "abandon", "airflow", "airflow_metadata_error", "app",
    "backfill", "console", "dead_letters", "demo", "find", "generate", "history", "localenv", "main", "maintain",
    "metrics", "migrate", "new", "publish", "reland", "reprocess", "reset", "run", "run_cause", "schema", "show",
    "state", "status", "verify",
]
