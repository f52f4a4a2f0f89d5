"""`microbatch run` lets dag.test()'s in-process Task Execution API serve only the newest API version
(`runner.serve_only_the_current_task_api`): that version's routes, methods and response schemas must be exactly
those Airflow's full bundle serves for it. Each side is built in a process of its own (the change is global)."""

from __future__ import annotations

import json
import subprocess
import sys

ROUTES = """
import json, re, sys
from pydantic import BaseModel
if sys.argv[1] == "current":
    from microbatch.airflow.runner import serve_only_the_current_task_api
    serve_only_the_current_task_api()
from airflow.api_fastapi.execution_api.app import create_task_execution_api_app
from airflow.api_fastapi.execution_api.versions import bundle
from airflow.sdk.api.datamodels._generated import API_VERSION
app = create_task_execution_api_app()
app._cadwyn_initialize()
out = []
for route in app.router.versioned_routers[API_VERSION].routes:
    model = getattr(route, "response_model", None)
    plain = lambda obj: re.sub(r" at 0x[0-9a-f]+", "", repr(obj))  # noqa: E731
    schema = model.model_json_schema() if isinstance(model, type) and issubclass(model, BaseModel) else plain(model)
    body = getattr(getattr(route, "body_field", None), "type_", None)
    body = body.model_json_schema() if isinstance(body, type) and issubclass(body, BaseModel) else plain(body)
    out.append([route.path, sorted(getattr(route, "methods", None) or []), schema, body])
print(json.dumps({"versions": len(bundle.versions), "routes": sorted(out, key=json.dumps)}, default=str))
"""


def routes(which: str) -> dict:
    done = subprocess.run([sys.executable, "-c", ROUTES, which], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_newest_version_is_served_as_airflows_full_bundle_serves_it():
    full, current = routes("full"), routes("current")
    assert full["versions"] > 1 and current["versions"] == 1  # the newest alone (the head is not counted)
    assert len(full["routes"]) >= 20
    assert current["routes"] == full["routes"]
