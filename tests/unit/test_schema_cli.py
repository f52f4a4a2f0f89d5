"""`microbatch schema` prints the pipeline spec's JSON Schema, from the pydantic models, as the CLI runs."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_schema_prints_the_spec_json_schema():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "include"), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "microbatch.cli", "schema"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    schema = json.loads(done.stdout)
    assert schema["title"] == "PipelineSpec"
    assert "source" in schema["properties"]
    assert {"name", "source", "job", "sinks"} <= set(schema["required"])
