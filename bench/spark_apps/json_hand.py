"""The Python job of bench/json_job.py's `hand` leg: the JSON payment value decoded by hand, as spark_jobs/clicks.py
decodes its clicks. The spec leaves the value raw (bytes); `parse` reads it with `from_json(value::string, schema)`
and makes a record that lacks a required field a dead letter; `outputs` gives every good record as one row for the
`postgres_append` sink `payments`. Options: `fields` (name -> Spark SQL type, in order) and `required` (names).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

SOURCE = ("topic", "partition", "offset", "value")


class HandJson:
    """Implements `microbatch.transform.SparkJob`."""

    def parse(self, records: DataFrame, options: Mapping[str, Any], state: Mapping[str, Any]) -> DataFrame:
        fields: Mapping[str, str] = options["fields"]
        schema = ", ".join(f"{name} {kind}" for name, kind in fields.items())
        parsed = records.select(*SOURCE, F.from_json(F.col("value").cast("string"), schema).alias("_p"))
        typed = parsed.select(*SOURCE, *(F.col(f"_p.{name}").alias(name) for name in fields))
        missing = F.lit(False)
        for name in options["required"]:
            missing = missing | F.col(name).isNull()
        error = (F.when(F.col("value").isNull(), F.lit("empty record"))
                 .when(missing, F.lit(f"not a payment: needs {' and '.join(options['required'])}")))
        return typed.select("*", F.lit(None).cast("timestamp").alias("event_time"), error.alias("error"),
                            F.lit(False).alias("late"))

    def state_metrics(self, options: Mapping[str, Any]) -> dict[str, Column]:
        return {}

    def next_state(
        self, state: Mapping[str, Any], metrics: Mapping[str, Any], options: Mapping[str, Any]
    ) -> dict[str, Any]:
        return dict(state)

    def outputs(
        self, parsed: DataFrame, options: Mapping[str, Any], state: Mapping[str, Any]
    ) -> dict[str, DataFrame]:
        return {"payments": parsed.select(*options["fields"], "topic", "partition", "offset")}


transform = HandJson()
