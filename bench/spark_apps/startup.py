"""The fixed cost of spark-submit: time from launch to a ready SparkSession, and to its stop.

spark-submit startup.py; prints BENCH:{python_start, session_ready, first_job_done, stopped} (epoch seconds).
"""

from __future__ import annotations

import json
import time

STARTED = time.time()

from pyspark.sql import SparkSession  # noqa: E402

spark = SparkSession.builder.appName("bench-startup").getOrCreate()
ready = time.time()
spark.range(10).count()
first_job = time.time()
spark.stop()
print("BENCH:" + json.dumps({"python_start": STARTED, "session_ready": ready, "first_job_done": first_job,
                             "stopped": time.time()}), flush=True)
