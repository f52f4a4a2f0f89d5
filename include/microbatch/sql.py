"""A sink's SQL query over the view `records`, checked when the spec loads and rewritten for exactly-once.

Pure logic over sqlglot's parse of Spark SQL: no Spark, so the spec's loader (the DAG file, the plan) checks a
query where no JVM runs. `sink_query` refuses, in one sentence naming the sink, a query that does not parse, is
not one SELECT over `records`, names a column `records` lacks, calls a function whose result changes from run to
run (a replay must give the same rows), or returns other columns than the sink's. It then adds what the sink
needs for exactly-once, so that a query never names it:

- a **row sink** (append, upsert, delta) keeps one row per record, so its query is a projection and a filter: the
  platform adds the record's `topic`, `partition` and `offset` to the select list;
- an **aggregate sink** keeps the partial sums of each source partition: the platform adds `topic` and `partition`
  to the select list and the GROUP BY, and each sum column must be a SUM or COUNT, which add up over the partials.

`window_start(ts)` and `window_end(ts)` (optionally with the width, `window_start(ts, '1 minute')`) are the tumbling
event-time window of the pipeline's `event_time.window`, rewritten to plain arithmetic on epoch seconds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

VIEW = "records"
"""The view a query reads: the records of the batch, with the columns the formats decode."""
COORDINATES = ("topic", "partition", "offset")
WINDOW_FUNCTIONS = ("window_start", "window_end")
NONDETERMINISTIC = frozenset({
    "rand", "randn", "random", "uniform", "randstr", "uuid", "shuffle", "now", "current_timestamp", "current_date",
    "curdate", "localtimestamp", "current_timezone", "unix_timestamp", "monotonically_increasing_id",
    "spark_partition_id", "input_file_name", "input_file_block_start", "input_file_block_length", "current_user",
    "user", "session_user", "current_database", "current_schema", "current_catalog", "try_reflect", "reflect",
    "java_method",
})
"""Functions whose result is not a function of the record (`unix_timestamp` only without arguments)."""
SUMMABLE = (exp.Sum, exp.Count)
_UNITS = {"second": 1, "seconds": 1, "minute": 60, "minutes": 60, "hour": 3600, "hours": 3600, "day": 86400,
          "days": 86400}


@dataclass(frozen=True)
class SinkQuery:
    """A checked query, with what the platform adds: `sql`, the whole query as Spark SQL (for the docs and the
    logs), and its parts as the stage builds them on the job's DataFrame: `select` (each output's expression and
    name), `where` (or None) and `group_by` (empty for a row sink). `columns` are the sink's columns it returns."""

    sql: str
    columns: tuple[str, ...]
    select: tuple[tuple[str, str], ...]
    where: str | None
    group_by: tuple[str, ...]


def _function_name(node: exp.Expression) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    return str(node.sql_name()).lower() if isinstance(node, exp.Func) else ""


def window_width(literal: str) -> int:
    """Seconds of a width such as '1 minute', '30 seconds', '1m', '30s'; ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*(s|m|h|d|second|seconds|minute|minutes|hour|hours|day|days)\s*", literal.lower())
    if not match or int(match.group(1)) <= 0:
        raise ValueError(f"'{literal}' is not a window width; write e.g. '1 minute' or '30 seconds'")
    unit = match.group(2)
    return int(match.group(1)) * ({"s": 1, "m": 60, "h": 3600, "d": 86400}.get(unit) or _UNITS[unit])


def sink_query(
    sink: str, sql: str, kind: Literal["rows", "partials"], available: Iterable[str], expected: Sequence[str],
    window_seconds: int | None,
) -> SinkQuery:
    """Check `sql`, the query of `sink`, against the columns of `records` (`available`) and the sink's own
    (`expected`, in any order), and rewrite it for the sink's `kind`; ValueError with one sentence otherwise."""
    where = f"sinks: sink '{sink}' sql"
    try:
        statements = [s for s in sqlglot.parse(sql, read="spark") if s is not None]
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        at = f" near '{first.get('highlight')}'" if first.get("highlight") else ""
        raise ValueError(f"{where} does not parse as Spark SQL{at}; fix the query") from None
    if len(statements) != 1 or not isinstance(statements[0], exp.Select):
        raise ValueError(f"{where} must be one SELECT ... FROM {VIEW} [WHERE ...] [GROUP BY ...] query")
    query = statements[0]
    unsupported = [name for name, key in (("JOIN", "joins"), ("HAVING", "having"), ("ORDER BY", "order"),
                                           ("LIMIT", "limit"), ("DISTINCT", "distinct"), ("WITH", "with"),
                                           ("a lateral view", "laterals"), ("QUALIFY", "qualify"))
                   if query.args.get(key)]
    nested = [q for q in query.find_all(exp.Select) if q is not query]
    if unsupported or nested or query.find(exp.Window):
        what = unsupported[0] if unsupported else "a subquery" if nested else "a window function (OVER)"
        raise ValueError(f"{where} uses {what}; a sink's query is SELECT ... FROM {VIEW} [WHERE ...] [GROUP BY ...] "
                         "(an aggregate's table adds up each partition's partial sums, so a HAVING or an ORDER BY "
                         "would act on partials), or use a Python job")
    tables = {table.name.lower() for table in query.find_all(exp.Table)}
    if tables != {VIEW}:
        raise ValueError(f"{where} reads {', '.join(sorted(tables)) or 'no table'}; a query reads the view {VIEW} "
                         "only (the batch's records)")
    for table in query.find_all(exp.Table):
        table.set("this", exp.to_identifier(VIEW))  # one spelling, which the stage replaces by the batch's rows
    if any(isinstance(s, exp.Star) or (isinstance(s, exp.Column) and isinstance(s.this, exp.Star))
           for s in query.expressions):
        raise ValueError(f"{where} selects *; name the sink's columns ({', '.join(expected)})")
    for node in query.find_all(exp.Func):
        name = _function_name(node)
        if isinstance(node, exp.StrToUnix) and (node.this is None or isinstance(node.this, exp.CurrentTimestamp)):
            name = "unix_timestamp"  # without an argument: the current time
        elif name == "unix_timestamp" and any(node.args.values()):
            continue
        if name in NONDETERMINISTIC:
            raise ValueError(f"{where} calls {name}(), whose result changes from run to run; a replay must give the "
                             "same rows, so compute from the record's columns (e.g. its timestamp)")
    _rewrite_windows(query, where, window_seconds)
    names = [s.alias_or_name for s in query.expressions]
    coordinates = [n for n in names if n.lower() in COORDINATES]
    if coordinates:
        raise ValueError(f"{where} returns {', '.join(coordinates)}, which the platform adds itself; remove "
                         f"{'it' if len(coordinates) == 1 else 'them'}")
    missing = [c for c in expected if c not in names]
    extra = [n for n in names if n not in expected]
    if missing or extra or len(set(names)) != len(names):
        raise ValueError(f"{where} returns {', '.join(names)}, but the sink's columns are {', '.join(expected)}; "
                         "alias each expression as a column of the sink (AS name)")
    known = {c.lower() for c in available}
    aliases = {n.lower() for n in names}
    for column in query.find_all(exp.Column):
        name = column.name.lower()
        if column.table and column.table.lower() in known:
            continue  # a field of a struct column: `customer.name`
        if name not in known and not (name in aliases and _in_group_or_order(column)):
            raise ValueError(f"{where} names the column '{column.name}', which {VIEW} lacks; its columns are "
                             f"{', '.join(sorted(available))}")
    aggregates = list(query.find_all(exp.AggFunc))
    group = query.args.get("group")
    outputs = [(s.this if isinstance(s, exp.Alias) else s) for s in query.expressions]
    if kind == "rows":
        if group or aggregates:
            raise ValueError(f"{where} must keep one row per record (a row sink's rows carry their record's "
                             "coordinates): no GROUP BY or aggregate")
        added = list(COORDINATES)
        groups: list[str] = []
    else:
        if not group:
            raise ValueError(f"{where} of an aggregate sink needs a GROUP BY of its key columns")
        for select, value in zip(query.expressions, outputs, strict=True):
            if value.find(exp.AggFunc) is not None and not isinstance(value, SUMMABLE):
                raise ValueError(f"{where}: '{select.alias_or_name}' must be a SUM(...) or COUNT(...), which add up "
                                 "over the partial sums of each source partition the table keeps")
        groups = [_grouping(g, outputs, names, known, where).sql(dialect="spark") for g in group.expressions]
        for value, name in zip(outputs, names, strict=True):
            if value.find(exp.AggFunc) is None and value.sql(dialect="spark") not in groups:
                raise ValueError(f"{where}: '{name}' is neither a SUM/COUNT nor in the GROUP BY; group by it (e.g. "
                                 f"GROUP BY {value.sql(dialect='spark')}) or aggregate it")
        added = list(COORDINATES[:2])
        groups += [f"`{c}`" for c in added]
    select = tuple((v.sql(dialect="spark"), n) for v, n in zip(outputs, names, strict=True)) + tuple(
        (f"`{c}`", c) for c in added)
    condition = query.args.get("where")
    rewritten = query.select(*[exp.column(c, quoted=True) for c in added], copy=True)
    if kind == "partials":
        rewritten = rewritten.group_by(*[exp.column(c, quoted=True) for c in added], copy=False)
    return SinkQuery(sql=rewritten.sql(dialect="spark"), columns=tuple(names), select=select,
                     where=condition.this.sql(dialect="spark") if condition is not None else None,
                     group_by=tuple(groups))


def _grouping(item: exp.Expression, outputs: list[exp.Expression], names: list[str], known: set[str],
              where: str) -> exp.Expression:
    """A GROUP BY item as an expression: an ordinal (`GROUP BY 1`) or an output's alias names that output's."""
    if isinstance(item, exp.Literal) and not item.is_string:
        position = int(item.this)
        if not 1 <= position <= len(outputs):
            raise ValueError(f"{where}: GROUP BY {position} is not a position of the select list")
        return outputs[position - 1]
    if isinstance(item, exp.Column) and item.name.lower() not in known and item.name in names:
        return outputs[names.index(item.name)]
    return item


def _in_group_or_order(column: exp.Column) -> bool:
    return column.find_ancestor(exp.Group, exp.Order) is not None


def _rewrite_windows(query: exp.Select, where: str, window_seconds: int | None) -> None:
    """`window_start(ts[, width])` -> the start of ts's tumbling window as a timestamp; `window_end` its end."""
    for node in list(query.find_all(exp.Anonymous)):
        name = str(node.name).lower()
        if name not in WINDOW_FUNCTIONS:
            continue
        args = node.expressions
        if not args or len(args) > 2:
            raise ValueError(f"{where} calls {name}() with {len(args)} arguments; write {name}(ts) or "
                             f"{name}(ts, '1 minute')")
        if len(args) == 2:
            if not (isinstance(args[1], exp.Literal) and args[1].is_string):
                raise ValueError(f"{where}: the width of {name}() must be a string literal such as '1 minute'")
            try:
                width = window_width(args[1].this)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            if window_seconds is not None and width != window_seconds:
                raise ValueError(f"{where}: {name}() is {width} s wide, but event_time.window is {window_seconds} s; "
                                 "use one width (the watermark closes the windows of event_time.window)")
        elif window_seconds is None:
            raise ValueError(f"{where} calls {name}() without a width and event_time.window is not set; set "
                             "event_time.window, or write e.g. " + f"{name}(ts, '1 minute')")
        else:
            width = window_seconds
        start = f"FLOOR(UNIX_SECONDS(CAST({args[0].sql(dialect='spark')} AS TIMESTAMP)) / {width}) * {width}"
        bound = start if name == "window_start" else f"{start} + {width}"
        node.replace(sqlglot.parse_one(f"TIMESTAMP_SECONDS({bound})", read="spark"))
