"""The plan phase: read the ledger and the broker, decide the next batch, insert it.

The decision itself is the pure `planning.plan_run` (`plan_batch`, and `follow_on_plans` for the further batches
of a run under `source.max_batches_per_run`); this module only does the I/O around it, one call each: the sinks
and the transform are checked, the ledger's positions read, the broker asked (`offsets.read_source`), the ledger
read under the pipeline's lock, the planner decides, and the ledger records the decision in the same transaction.
The pipeline row is locked FOR UPDATE, so two planners never race, and open batches are always reused: a retry
never plans new ranges while an earlier batch is open.
"""

from __future__ import annotations

import ast
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

from microbatch import failpoints
from microbatch.config import PipelineSpec
from microbatch.errors import SpecError
from microbatch.formats.schema_registry import Registry
from microbatch.kafka.offsets import read_source
from microbatch.kafka.topics import missing_output_topics
from microbatch.ledger import repository as repo
from microbatch.ledger.database import Ledger
from microbatch.phases.pins import configured_registry, plan_pins
from microbatch.planning import plan_run
from microbatch.runtime import PROJECT_ROOT
from microbatch.settings import KafkaSettings
from microbatch.sinks import schema
from microbatch.sinks.base import Sink
from microbatch.sinks.registry import sinks_of
from microbatch.types import OffsetRange, Plan, TopicPartition

log = logging.getLogger(__name__)
LIST_OFFSETS = failpoints.point("plan.list_offsets")  # a hold point between the two offset lookups
JOB_METHODS = ("parse", "state_metrics", "next_state", "outputs")
"""The methods of the transform contract (`transform.SparkJob`)."""


@dataclass
class PlanOutcome:
    batch_ids: list[int]
    """The run's batches in the order they stage and commit: none, one, or up to `source.max_batches_per_run`."""
    reused: bool
    ranges: list[OffsetRange]
    plan: Plan | None
    latest: dict[TopicPartition, int]
    seconds: float

    @property
    def batch_id(self) -> int | None:
        """The run's first batch; None when there is nothing to read."""
        return self.batch_ids[0] if self.batch_ids else None

    @property
    def records(self) -> int:
        return sum(r.size for r in self.ranges)


def plan_next_batch(
    spec: PipelineSpec, ledger: Ledger, kafka: KafkaSettings, airflow_run_id: str | None = None,
    outputs: Callable[[str], KafkaSettings] | None = None, registry: Callable[[], Registry] = configured_registry,
) -> PlanOutcome:
    """Reuse the open batches, or plan and insert new ones (one, or up to `source.max_batches_per_run` when the
    backlog is larger than a batch); no batch id when there is nothing to read.

    Discovery runs on every plan (listed topics, or the topic pattern). Partitions the ledger has never
    seen start by `source.startup`, and their start is pinned in the ledger in the same transaction, so
    the mode applies once. Every fresh plan records the lag of each partition. A key or value read through a
    schema registry (`registry`) has its schemas pinned in each new batch (`phases/pins.py`).
    """
    started = time.monotonic()
    check_pipeline(spec, ledger, outputs or (lambda _: kafka))
    pins = plan_pins(spec, registry)
    with ledger.transaction() as session:  # read only: nothing is written before the broker has answered
        known = repo.known_positions(session, spec.name)
    earliest, latest, looked_up = read_source(kafka, spec.source, known,
                                              group_id=spec.source.startup.group_id or spec.group_id,
                                              failpoint=LIST_OFFSETS)
    with ledger.transaction() as session:
        pipeline, held = repo.read_planning_ledger(session, spec)
        run = plan_run(held, earliest, latest, spec.source, looked_up)
        abandoned, batch_ids, pruned = repo.record_run(
            session, pipeline, run.plan, run.plans, abandon_from=run.abandon_from, latest=latest,
            airflow_run_id=airflow_run_id, started=started, formats=pins.formats)
        if batch_ids:
            repo.record_schemas(session, pipeline.id, pins.schemas)
    for closed_id in abandoned:  # retention ran between plan and stage: that batch and the ones after it are closed
        log.warning("abandoned batch %s: %s", closed_id, run.abandon_from[1] if run.abandon_from else "")
    if run.reused:
        return PlanOutcome([b.batch_id for b in run.reused], True, [r for b in run.reused for r in b.ranges],
                           None, latest, time.monotonic() - started)
    plan = run.plan
    assert plan is not None
    if pruned:
        log.info("pruned %s lag snapshot(s) older than %s days", pruned, repo.LAG_RETENTION_DAYS)
    if plan.disappeared_topics:
        log.warning("topic(s) %s no longer exist or match; their ledger positions are kept",
                    ", ".join(plan.disappeared_topics))
    return PlanOutcome(batch_ids, False, [r for each in run.plans for r in each.ranges], plan, latest,
                       time.monotonic() - started)


def check_pipeline(spec: PipelineSpec, ledger: Ledger,
                   outputs: Callable[[str], KafkaSettings] | None = None) -> dict[str, Sink]:
    """Before anything is written: the sink tables exist and match the spec, the output topics exist (on the
    cluster `outputs` gives for each kafka sink's connection), and the transform can be found and has the
    contract's methods; return the pipeline's sinks by name. A mismatch raises `SpecError` (terminal: a retry
    cannot help)."""
    check_transform(spec)
    sinks = sinks_of(spec)
    with ledger.engine.connect() as conn:
        schema.check_sinks(conn, spec, sinks)
    if outputs is not None:
        check_output_topics(spec, outputs)
    return sinks


def check_output_topics(spec: PipelineSpec, outputs: Callable[[str], KafkaSettings]) -> None:
    """Refuse a batch whose kafka sink has no topic to publish to: it would commit with nowhere to go."""
    missing = missing_output_topics(spec, outputs)
    if missing:
        sink, topic = missing[0]
        raise SpecError(f"The output topic '{topic}' of sink '{sink}' does not exist, so no batch was planned.",
                        fix="Run `microbatch migrate`, which creates it with the spec's partitions, replication "
                        "factor and topic_config.")


def check_transform(spec: PipelineSpec) -> None:
    """`job.transform` names a module the stage can import and, in it, an object with the contract's methods.

    The module is found and read, not imported: importing it would import pyspark, which only the stage may.
    What the source does not show (an object built by a factory, or imported from elsewhere) is taken on trust;
    the stage imports it for real. A SQL pipeline's queries were checked when its spec loaded."""
    if spec.job is None:
        return
    module_name, _, attribute = spec.job.transform.partition(":")
    where = f"{spec.name}.yaml: field 'job.transform' names '{spec.job.transform}'"
    found = _find_module(module_name)
    if found is None:
        raise SpecError(f"{where}, but module {module_name} is not found (on the Python path or in the project "
                        f"{PROJECT_ROOT}); fix the module path, or add the module.")
    if not (found.origin and found.origin.endswith(".py")):
        return  # a compiled or namespace module: nothing to read
    try:
        tree = ast.parse(Path(found.origin).read_text(), filename=found.origin)
    except (OSError, SyntaxError, ValueError) as exc:
        line = f" at line {exc.lineno}" if isinstance(exc, SyntaxError) and exc.lineno else ""
        raise SpecError(f"{where}, but {found.origin} cannot be read as Python{line} ({type(exc).__name__}); "
                        "fix the module.") from None
    methods = _job_methods(tree, attribute)
    if methods is _ABSENT:
        raise SpecError(f"{where}, but module {module_name} defines no '{attribute}'; fix the name after the "
                        "colon, or define it in the module.")
    missing = [m for m in JOB_METHODS if methods is not None and m not in methods]
    if missing:
        raise SpecError(f"{where}, but '{attribute}' lacks the method(s) {', '.join(missing)} of the transform "
                        f"contract ({', '.join(JOB_METHODS)}); add them (see microbatch/transform.py).")


def _find_module(name: str) -> ModuleSpec | None:
    """Where `name` would be imported from (the Python path, then the project root that the stage's
    `--py-files` zip is made from), without running any of its packages' code."""
    locations = [*sys.path, str(PROJECT_ROOT)]
    found = None
    parts = name.split(".")
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        try:
            found = PathFinder.find_spec(".".join(parts[: depth + 1]), locations)
        except KeyError:  # a namespace package (no __init__.py) in one that is not imported: importlib looks
            found = None  # its parent up in sys.modules; its portions are the folders of that name
            locations = [str(Path(p) / part) for p in locations if (Path(p) / part).is_dir()]
            if last or not locations:
                return None
            continue
        except (ImportError, ValueError):
            return None
        if found is None:
            return None
        if not last:
            if not found.submodule_search_locations:
                return None  # a module, not a package: it has no submodules
            locations = list(found.submodule_search_locations)
    return found


_ABSENT: set[str] = set()
"""`_job_methods`: the module does not bind the name at all."""


def _job_methods(tree: ast.Module, attribute: str) -> set[str] | None:
    """The methods of the object the module binds to `attribute`: a class's, or those of the class it is an
    instance of; `_ABSENT` if the module never binds the name; None if the source cannot tell (taken on trust)."""
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    bound: ast.AST | None = None
    for node in tree.body:
        if (isinstance(node, ast.FunctionDef) and node.name == "__getattr__") or "*" in _names_bound(node):
            return None  # the module makes attributes up, or takes another module's names
        if attribute in _names_bound(node):
            bound = getattr(node, "value", None) if isinstance(node, ast.Assign | ast.AnnAssign) else node
    if bound is None:
        # Bound only under an `if`, a `try` or the like, the source cannot tell which binding wins.
        return None if any(attribute in _names_bound(node) for node in ast.walk(tree)) else _ABSENT
    if isinstance(bound, ast.Call) and isinstance(bound.func, ast.Name):
        bound = classes.get(bound.func.id, bound)
    if isinstance(bound, ast.ClassDef):
        return _class_methods(bound, classes)
    if isinstance(bound, ast.FunctionDef | ast.AsyncFunctionDef):
        return set()  # a function is not an object with the contract's methods
    return None


def _names_bound(node: ast.AST) -> set[str]:
    """The names one statement binds in its scope."""
    if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return {node.name}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {alias.asname or alias.name.split(".")[0] for alias in node.names}
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor | ast.NamedExpr):
        return {n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def _class_methods(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> set[str] | None:
    """The methods a class defines or inherits from classes of the same module; None if a base lies elsewhere."""
    methods = {node.name for node in cls.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    for base in cls.bases:
        parent = classes.get(base.id) if isinstance(base, ast.Name) else None
        if parent is None or parent is cls:
            if isinstance(base, ast.Name) and base.id in ("object", "Protocol", "SparkJob"):
                continue
            return None
        inherited = _class_methods(parent, classes)
        if inherited is None:
            return None
        methods |= inherited
    return methods
