"""The DAG factory: one builder for a pipeline's scheduled DAG and its backfill DAG, `plan >> stage >> commit`
(`>> publish` with a Kafka sink). The two differ only in their DAG arguments and their plan task.

Building a DAG reads the spec file and nothing else (and, for `spark.mode: auto`, whether
`MICROBATCH_SPARK_REMOTE` is set): connections, the ledger and Kafka are touched only when a task runs
(`microbatch.airflow.hooks`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Asset, Param, task
from airflow.sdk.exceptions import AirflowSkipException

from microbatch import settings
from microbatch.airflow import hooks
from microbatch.airflow.operators import STAGE_OPERATORS, LakeMaintenanceOperator, batch_id_list, resolved, task_errors
from microbatch.config import PipelineSpec, find_spec
from microbatch.errors import error_summary
from microbatch.sinks.capabilities import Publisher
from microbatch.sinks.registry import maintained, publishing, sinks_of

log = logging.getLogger("microbatch")


def pipeline_dag(name: str) -> DAG:
    """Build the DAG of the pipeline `name`; a bad spec raises here, breaking only this DAG file."""
    return build_dag(find_spec(name))


def backfill_dag(name: str) -> DAG:
    """Build the backfill DAG of the pipeline `name`."""
    return build_dag(find_spec(name), backfill=True)


def maintenance_dag(name: str) -> DAG | None:
    """The `<pipeline>__maintenance` DAG of a pipeline with sinks that need maintenance (None without), e.g.
    compaction and vacuum of Delta tables, on the schedule of its first such sink. The job is a spark-submit in
    every `spark.mode`: a pipeline that stages through Spark Connect maintains on the default Spark connection."""
    spec = find_spec(name)
    sinks = maintained(spec)
    if not sinks:
        return None
    spec = spec.model_copy(update={"spark": spec.spark.for_submit()})
    with DAG(dag_id=f"{spec.name}__maintenance", schedule=sinks[0].maintenance_schedule,
             start_date=datetime(2024, 1, 1), catchup=False, max_active_runs=1, default_args=_default_args(spec),
             description=f"{sinks[0].maintenance_summary} of {spec.name}",
             tags=["microbatch", "maintenance", *spec.tags]) as dag:
        LakeMaintenanceOperator(task_id="maintain", spec=spec)
    return dag


def build_dag(spec: PipelineSpec, *, backfill: bool = False) -> DAG:
    """The scheduled DAG of one pipeline, or with `backfill` its `<pipeline>__backfill` DAG:
    plan >> stage >> commit (>> publish with a Kafka sink), the stage task of `spec.spark.mode` (`auto` resolved
    here, so every task of the DAG sees the same concrete mode)."""
    spec = spec.model_copy(update={"spark": spec.spark.resolved(settings.spark_remote_set())})
    dag_args, plan_task = (_backfill_dag_args(spec), _backfill_plan_task(spec)) if backfill else \
        (_scheduled_dag_args(spec), _plan_task(spec))
    with DAG(**dag_args, start_date=datetime(2024, 1, 1), catchup=False, max_active_runs=1,
             default_args=_default_args(spec)) as dag:
        batch_ids = plan_task()
        stage = STAGE_OPERATORS[spec.spark.mode](task_id="stage", spec=spec)  # reads plan's XCom by template
        committed = _commit_task(spec)(batch_ids)
        batch_ids >> stage >> committed
        if publishing(spec):
            committed >> _publish_task(spec)()
    return dag


def _default_args(spec: PipelineSpec) -> dict[str, Any]:
    return {
        "retries": spec.retries.count,
        "retry_delay": timedelta(seconds=spec.retries.delay_seconds),
        "retry_exponential_backoff": spec.retries.backoff if spec.retries.backoff != 1 else 0,
        "max_retry_delay": timedelta(seconds=spec.retries.max_delay_seconds),
        "owner": "microbatch",
    }


def _scheduled_dag_args(spec: PipelineSpec) -> dict[str, Any]:
    return {
        "dag_id": spec.name,
        "description": spec.description or f"microbatch pipeline {spec.name}",
        "schedule": spec.schedule_value,
        "tags": ["microbatch", *spec.tags],
        "doc_md": f"Exactly-once micro-batches of `{', '.join(spec.source.topics) or spec.source.topic_pattern}` "
        f"into `{', '.join(s.name for s in spec.sinks)}`. Spec: `include/pipelines/{spec.name}.yaml`.",
    }


def _backfill_dag_args(spec: PipelineSpec) -> dict[str, Any]:
    """Not scheduled; a validated trigger form; fill by offsets or times."""
    from microbatch.phases.backfill import PARTITIONS_PATTERN
    topics = spec.source.topics
    topic = (Param(topics[0], type="string", enum=topics, description="The topic to backfill.") if topics
             else Param("", type="string", description=f"A topic matching {spec.source.topic_pattern}."))
    # One JSON type per field: a field of several types is a JSON text area in Airflow 3's form; an integer is a
    # number field, a date-time a picker. `phases/backfill.parse_params` reads them back (and validates as before).
    params = {
        "topic": topic,
        "partitions": Param("all", type="string", pattern=PARTITIONS_PATTERN,
                            description="all, or partition numbers separated by commas, such as 0, 2."),
        "start": Param(0, type="integer", minimum=0, description="First offset."),
        "end": Param(None, type=["null", "integer"], minimum=0,
                     description="End offset (exclusive); empty: each partition's latest offset."),
        "start_time": Param(None, type=["null", "string"], format="date-time",
                            description="Instead of the start offset: the first offset at or after this time."),
        "end_time": Param(None, type=["null", "string"], format="date-time",
                          description="Instead of the end offset: the first offset at or after this time "
                          "(exclusive). With start_time."),
        "mode": Param("fill", type="string", enum=["fill", "replay"],
                      description="fill: only never-committed offsets. replay: recompute committed offsets "
                      "(widened to whole committed batches) and replace their output."),
        "dry_run": Param(False, type="boolean", description="Print the plan and write nothing."),
    }
    return {
        "dag_id": f"{spec.name}__backfill",
        "description": f"Backfill of microbatch pipeline {spec.name} by offset or time range",
        "schedule": None,
        "params": params,
        "tags": ["microbatch", "backfill", *spec.tags],
        "doc_md": f"Backfill `{spec.name}`: a ledger entry of its own that never moves the scheduled cursor. "
        "Mode `fill` processes only the sub-ranges never committed and below the scheduled position; "
        "mode `replay` recomputes committed ranges and replaces their output in one transaction.",
    }


def _output_clusters(connection: str) -> Any:
    """The Kafka cluster of a kafka sink's connection (the plan checks its output topic exists)."""
    return resolved(hooks.KafkaHook(connection).get_conn)


def _plan_task(spec: PipelineSpec) -> Callable[[], Any]:
    @task(task_id="plan")
    def plan(**context: Any) -> str:
        from microbatch.phases.plan import plan_next_batch
        from microbatch.phases.reporting import log_plan_summary

        ledger = resolved(hooks.LedgerHook().get_conn)
        kafka = resolved(hooks.KafkaHook(spec.source.connection).get_conn)
        with task_errors(ledger, "The plan"):
            outcome = plan_next_batch(spec, ledger, kafka, context["run_id"], outputs=_output_clusters,
                                      registry=hooks.schema_registry)
        log_plan_summary(log, spec.name, outcome)
        if outcome.batch_id is None:
            raise AirflowSkipException("nothing new to read")
        return ",".join(str(b) for b in outcome.batch_ids)  # stage and commit take them in this order

    return plan


def _backfill_plan_task(spec: PipelineSpec) -> Callable[[], Any]:
    @task(task_id="plan")
    def plan(**context: Any) -> str:
        from microbatch.phases.backfill import plan_backfill
        from microbatch.phases.reporting import log_backfill_plan

        ledger = resolved(hooks.LedgerHook().get_conn)
        kafka = resolved(hooks.KafkaHook(spec.source.connection).get_conn)
        with task_errors(ledger, "The backfill's plan"):
            outcome = plan_backfill(spec, dict(context["params"]), ledger, kafka, context["run_id"],
                                    outputs=_output_clusters, registry=hooks.schema_registry)
        log_backfill_plan(log, spec.name, outcome)
        if not outcome.batch_ids:
            raise AirflowSkipException("dry run" if outcome.params.dry_run else f"nothing to {outcome.params.mode}")
        return ",".join(str(b) for b in outcome.batch_ids)

    return plan


def sink_assets(spec: PipelineSpec) -> list[Asset]:
    """The tables every sink but a publishing one writes (Postgres tables, lakehouse tables), updated by
    `commit`; each sink names its assets (`Sink.assets`)."""
    return [Asset(name=ref.name, uri=ref.uri)
            for sink in sinks_of(spec).values() if not isinstance(sink, Publisher) for ref in sink.assets(spec.name)]


def topic_assets(spec: PipelineSpec) -> list[Asset]:
    """The Kafka output topics, updated by `publish`."""
    return [Asset(name=ref.name, uri=ref.uri) for sink in publishing(spec) for ref in sink.assets(spec.name)]


def _commit_task(spec: PipelineSpec) -> Any:
    """The commit task: one transaction per batch id (a comma-separated list for backfills)."""
    assets = sink_assets(spec)

    @task(task_id="commit", outlets=assets)
    def commit(batch_ids: int | str, **context: Any) -> list[dict[str, Any]]:
        from microbatch.airflow.lineage import emit_committed
        from microbatch.kafka.offsets import mirror_group_offsets
        from microbatch.phases.commit import AFTER_COMMIT, commit_batch
        from microbatch.phases.reporting import log_commit_summary

        ledger = resolved(hooks.LedgerHook().get_conn)
        kafka = hooks.KafkaHook(spec.source.connection)  # resolved on first use only, then kept for the task
        summaries = []
        for batch_id in batch_id_list(batch_ids):
            with task_errors(ledger, "The commit"), ledger.transaction() as session:
                result = commit_batch(session, spec, batch_id, context.get("run_id"))
            AFTER_COMMIT.hit()
            try:  # the batch is committed: what reports it never fails the task (a retry would find it committed)
                log_commit_summary(log, spec.name, result)
                emit_committed(spec, result, ledger.url, lambda: resolved(kafka.get_conn).bootstrap_servers)
            except Exception as exc:
                log.warning("batch %s is committed, but its report failed: %s", result.batch_id, error_summary(exc))
            if spec.source.commit_group_offsets and result.moves:
                mirror_group_offsets(resolved(kafka.get_conn), spec.group_id, {m.tp: m.after for m in result.moves})
            summaries.append({
                "batch_id": result.batch_id,
                "attempt": result.attempt,
                "already_committed": result.already_committed,
                "rows_by_sink": result.rows_by_sink,
                "dead_letters": result.dead_letters,
                "late_records": result.late_records,
                "outbox": {name: list(bounds) for name, bounds in result.outbox.items()},
                "positions": {str(m.tp): m.after for m in result.moves},
            })
        for asset in assets:
            context["outlet_events"][asset].extra = summaries[-1] if len(summaries) == 1 else {"batches": summaries}
        return summaries

    return commit


def _publish_task(spec: PipelineSpec) -> Any:
    # Runs after a skipped (nothing new) run too, so a failed publish is finished by the next run.
    @task(task_id="publish", outlets=topic_assets(spec), trigger_rule="none_failed")
    def publish() -> dict[str, Any]:
        from microbatch.phases.publish import publish_sink
        from microbatch.phases.reporting import log_publish_summary

        ledger = resolved(hooks.LedgerHook().get_conn)
        clusters = {conn_id: hooks.KafkaHook(conn_id) for conn_id in {s.spec.connection for s in publishing(spec)}}
        summary = {}
        for sink in publishing(spec):
            kafka = resolved(clusters[sink.spec.connection].get_conn)
            with task_errors(ledger, "The publish"):
                result = publish_sink(spec, sink.spec, ledger, kafka)
            log_publish_summary(log, spec.name, result)
            summary[sink.name] = {"first_seq": result.first_seq, "last_seq": result.last_seq,
                                  "records": result.records, "transactions": result.transactions}
        return summary

    return publish


def sync_dag_files() -> None:
    """Write the DAGs of every DAG bundle (this project's dags/) to Airflow's metadata DB, as `dag.test()` does
    first; the caller holds the metadata DB to itself (`runner.metadata_db`)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.utils.session import create_session

    manager = DagBundlesManager()
    with create_session() as session:
        manager.sync_bundles_to_db(session=session)
    for bundle in manager.get_all_dag_bundles():
        if not bundle.is_initialized:
            bundle.initialize()
        sync_bag_to_db(BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name=bundle.name),
                       bundle.name, bundle.version)
