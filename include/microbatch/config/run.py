"""How a pipeline's batches run: the Python job, the event time, task retries and the Spark mode."""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from microbatch.config.primitives import _duration_seconds, _Strict


class JobSpec(_Strict):
    """A Python job, for what a sink's `sql` cannot say: the object `transform` names, whose four methods (`parse`,
    `state_metrics`, `next_state`, `outputs`: `microbatch.transform.SparkJob`) the stage calls. A spec has a job or
    a `sql` per sink, not both."""

    transform: str
    """`package.module:name` of the job object, e.g. `spark_jobs.clicks:transform`."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Handed to each of the job's methods as `options`."""

    @field_validator("transform")
    @classmethod
    def _module_function(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value):
            raise ValueError("must look like 'package.module:function', e.g. 'spark_jobs.ip_count:transform'")
        return value


class RetrySpec(_Strict):
    """Task retries: 3 by default, the first after 10 s, each next one `backoff` times later (Airflow adds up to one
    delay again, so that retries of several tasks spread), at most `max_delay_seconds` apart: 10-20 s, 20-40 s and
    40-80 s, so that a service restarting meanwhile (a Spark Connect server, a broker) is found again. `backoff: 1`
    is Flink's `fixedDelayRestart(3, 10s)`."""

    count: int = Field(default=3, ge=0, le=20)
    delay_seconds: float = Field(default=10.0, ge=0)
    backoff: float = Field(default=2.0, ge=1)
    max_delay_seconds: float = Field(default=120.0, gt=0)

    def delay_bounds(self) -> list[tuple[float, float]]:
        """The (shortest, longest) wait before each retry, in seconds, as Airflow computes it from
        `retry_delay`, `retry_exponential_backoff` and `max_retry_delay`."""
        if self.backoff == 1:
            return [(self.delay_seconds, self.delay_seconds)] * self.count
        bounds = []
        for retry in range(self.count):
            low = max(1, math.ceil(self.delay_seconds * self.backoff ** retry))
            bounds.append((min(low, self.max_delay_seconds), min(2 * low - 1, self.max_delay_seconds)))
        return bounds


SPARK_CONNECTION_DEFAULTS = {"submit": "spark_default", "connect": "spark_connect_default"}


class SparkSpec(_Strict):
    """How the stage task runs the Spark job: spark-submit per batch, or a client of a Spark Connect server."""

    mode: Literal["submit", "connect", "auto"] = "submit"
    """`submit`: each stage task runs spark-submit (a new driver JVM per batch). `connect`: the stage task is a
    Spark Connect client of a long-lived server (`MICROBATCH_SPARK_REMOTE`, else `connection`), so no JVM
    starts per batch. `auto`: `connect` where `MICROBATCH_SPARK_REMOTE` is set when the DAG is built (the local
    stack of `make demo` / `make airflow` and the compose file set it), else `submit`; the shipped pipelines
    use it."""
    connection: str | None = None
    """Airflow connection id: mode `submit`, a Spark master (host `local[*]` or `spark://host:7077`), default
    `spark_default`; mode `connect`, a `spark_connect` connection (host `sc://HOST`, port 15002), default
    `spark_connect_default`. Mode `auto` takes the default of the mode it resolves to."""
    conf: dict[str, str] = Field(default_factory=dict)
    """Spark settings. In modes `connect` and `auto` only `spark.sql.*` settings, which a Connect session may
    change."""

    @model_validator(mode="before")
    @classmethod
    def _connection_default_of_the_mode(cls, data: Any) -> Any:
        if isinstance(data, dict) and "connection" not in data:
            default = SPARK_CONNECTION_DEFAULTS.get(data.get("mode", "submit"))
            if default:
                data = {**data, "connection": default}
        return data

    @field_validator("connection")
    @classmethod
    def _auto_takes_the_default(cls, connection: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("mode") == "auto" and connection is not None:
            raise ValueError("is not used in mode 'auto', which takes the default connection of the mode it "
                             "resolves to; remove it, or set mode 'submit' or 'connect' with it")
        return connection

    @field_validator("conf")
    @classmethod
    def _settable_in_the_mode(cls, conf: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        mode = info.data.get("mode")
        if mode not in ("connect", "auto"):
            return conf
        server_side = sorted(key for key in conf if not key.startswith("spark.sql."))
        if server_side:
            auto = "; mode 'auto' runs as a Connect client where MICROBATCH_SPARK_REMOTE is set" if mode == "auto" \
                else ""
            raise ValueError(
                f"sets {', '.join(server_side)}, which a Spark Connect session cannot change (only spark.sql.* "
                f"settings apply per session{auto}); set it on the Connect server (its --conf) and remove it here, "
                "or use mode 'submit'"
            )
        return conf

    def resolved(self, connect_server_set: bool) -> SparkSpec:
        """This spec with a concrete mode and connection: `auto` becomes `connect` when a Connect server is set
        (`MICROBATCH_SPARK_REMOTE`), else `submit`."""
        if self.mode != "auto":
            return self
        mode = "connect" if connect_server_set else "submit"
        return self.model_copy(update={"mode": mode, "connection": SPARK_CONNECTION_DEFAULTS[mode]})

    def for_submit(self) -> SparkSpec:
        """The settings of a spark-submit of this pipeline whatever its stage's mode (the Delta maintenance job):
        its own connection in mode `submit`, else the default Spark connection (`spark_default`)."""
        if self.mode == "submit":
            return self
        return self.model_copy(update={"mode": "submit", "connection": SPARK_CONNECTION_DEFAULTS["submit"]})


class EventTimeSpec(_Strict):
    """The pipeline's event time, declared once (Flink's watermark strategy): the watermark is the greatest event
    time seen minus `allowed_lateness`, kept in the pipeline state and committed with the batch; a valid record whose
    `window` was final (its end at or before the watermark) when its batch began is late, and goes to
    `late_records` (and to row sinks with `include_late`)."""

    column: str
    """The event time: a timestamp column of `records` (a decoded field such as `ts`, or the record `timestamp`).
    A SQL pipeline reads it from the records; a Python job computes its own `event_time` column, and the helpers
    of `spark_jobs/event_time.py` read `window` and `allowed_lateness` from this section."""
    window: str | None = None
    """The tumbling window width (`60s`, `1m`, `1h`) of `window_start(ts)`/`window_end(ts)` in SQL and of the
    Python helpers; unset: a record is late when its event time is at or before the watermark."""
    allowed_lateness: str = "5s"
    """How far behind the greatest event time seen a record may be before its window closes."""
    max_future: str = "1d"
    """How far ahead of its Kafka timestamp (a Python job without it: its batch's planned time) an event time may be;
    a record further ahead is a dead letter and does not move the watermark (a producer's clock set to 2999 would
    otherwise make every later record late)."""

    @field_validator("window", "allowed_lateness", "max_future", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is not None:
            _duration_seconds(value)
        return None if value is None else str(value)

    @property
    def window_seconds(self) -> int | None:
        return None if self.window is None else int(_duration_seconds(self.window))

    @property
    def allowed_lateness_seconds(self) -> float:
        return _duration_seconds(self.allowed_lateness)

    @property
    def max_future_seconds(self) -> float:
        return _duration_seconds(self.max_future)


EVENT_TIME_TYPES = ("timestamp", "timestamp_ntz")
"""What an event time column may be: a time, never a number read as seconds (epoch milliseconds would put the
watermark tens of thousands of years ahead)."""


def event_time_type_problem(column: str, kind: str) -> str:
    """The one sentence of an event time column that is not a timestamp, with the fix."""
    if kind in ("bigint", "int", "smallint", "tinyint") or kind.startswith("decimal") or kind == "double":
        fix = (f"if it holds epoch milliseconds, declare the field `{column}: {{type: timestamp, unit: ms}}` "
               "(unit: s or us for seconds or microseconds)")
    elif kind == "string":
        fix = (f"declare the field `{column}: timestamp` (ISO-8601), or `{column}: {{type: timestamp, format: "
               "\"dd/MM/yyyy HH:mm:ss\"}` for another pattern")
    else:
        fix = "name a timestamp column"
    return f"event_time.column: '{column}' is {kind}, not a timestamp; {fix}"


EVENT_TIME_OPTIONS = ("window_seconds", "allowed_lateness_seconds", "max_future_seconds")
"""The job options the platform fills in from `event_time` (`PipelineSpec.job_options`)."""
