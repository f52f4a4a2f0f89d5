"""Whether the stage's Spark has the formats' Java functions, and their registration in its session.

The functions are classes of the jar `runtime.formats_jar()` compiles from include/jvm. spark-submit gets it with
`--jars` and the local stack's Connect server at its start (both `runtime.spark_jars()`); another Spark (a Connect
server someone else started, a cluster) may lack it, and then each format decodes with Spark's built-in functions
alone: the same columns and reasons, more slowly (docs/performance.md).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from microbatch.formats.base import JavaFunction

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

JSON_DECODER = "microbatch.formats.JsonDecoder"
"""include/jvm/microbatch/formats/JsonDecoder.java: the json format's one-pass decode."""
_PROBE = "microbatch_formats_probe"


def available(spark: SparkSession) -> bool:
    """True when `spark` can load the formats jar's classes: registering one is what tells (Spark loads the class
    then, on the driver or the Connect server). False, and one log line saying why, otherwise."""
    try:
        spark.udf.registerJavaFunction(_PROBE, JSON_DECODER, "struct<e: string>")
    except Exception as exc:  # ClassNotFound surfaces as Spark's or Spark Connect's own error types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning("decode: this Spark has no microbatch formats jar (%s); decoding with Spark's built-in "
                    "functions instead (the same columns and reasons, slower). Run `make jars` and add the jar "
                    "runtime.formats_jar() builds to the Spark's --jars.", first[:300])
        return False
    return True


def register(spark: SparkSession, functions: Mapping[str, JavaFunction]) -> None:
    """Register each Java function under its name in `spark`'s session (for the query that calls it)."""
    for name, function in functions.items():
        spark.udf.registerJavaFunction(name, function.class_name, function.returns)
