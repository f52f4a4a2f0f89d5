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
    assert {"name", "source", "sinks"} <= set(schema["required"])
    assert {"job", "event_time"} <= set(schema["properties"])


def test_every_shipped_spec_passes_the_schema_an_editor_checks_and_a_bad_one_fails():
    import jsonschema
    import yaml

    from microbatch.config import PipelineSpec

    schema = PipelineSpec.model_json_schema()
    for path in sorted((ROOT / "include" / "pipelines").glob("*.yaml")):
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)  # short forms included (startup: earliest)
    bad = yaml.safe_load((ROOT / "include" / "pipelines" / "ip_count.yaml").read_text())
    bad["source"]["startup"] = 7
    try:
        jsonschema.validate(bad, schema)
    except jsonschema.ValidationError:
        return
    raise AssertionError("a startup of 7 passed the schema")
