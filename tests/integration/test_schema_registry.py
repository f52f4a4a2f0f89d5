"""The schema registry of the local stack, for real: `python -m microbatch.dev.stack registry` starts Apicurio Registry
(`microbatch.dev.registry.SchemaRegistry`) detached on a loopback port, records it and exports its URL in env.sh; its
Confluent-compatible API registers an Avro schema and a compatible second version, refuses an incompatible one (its
global compatibility is BACKWARD, as Confluent's) and
serves both by id; every socket it listens on is on 127.0.0.1; `down` stops it and leaves no process. One start."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from microbatch.dev import stack
from microbatch.dev.process import listening_sockets, port_open
from microbatch.dev.registry import CCOMPAT_PATH, COMPATIBILITY, PROCESS_MARKER, distribution_dir, ensure_registry
from microbatch.settings import SCHEMA_REGISTRY_URL_ENV

pytestmark = pytest.mark.integration

SUBJECT = "sales-value"  # TopicNameStrategy: the value schema of topic "sales"
V1 = {"type": "record", "name": "Sale", "namespace": "microbatch.test",
      "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "currency", "type": "string", "default": "EUR"}]}
INCOMPATIBLE = {**V1, "fields": [*V1["fields"], {"name": "shop", "type": "string"}]}  # new field, no default
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def call(url: str, method: str = "GET", body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """(HTTP status, decoded JSON body) of one request to the Confluent-compatible API."""
    request = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": CONTENT_TYPE, "Accept": CONTENT_TYPE})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def register(url: str, schema: dict[str, Any]) -> tuple[int, Any]:
    return call(f"{url}/subjects/{SUBJECT}/versions", "POST", {"schema": json.dumps(schema)})


@pytest.fixture
def own_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stack state of this test's own (MICROBATCH_CACHE_DIR), with the distribution the jars step fetched linked
    in, and the stack id that the stack sets in this process's environment undone afterwards."""
    distribution = ensure_registry()
    monkeypatch.setenv(stack.STACK_ID_ENV, "")
    monkeypatch.setenv("MICROBATCH_CACHE_DIR", str(tmp_path))
    distribution_dir().parent.mkdir(parents=True)
    distribution_dir().symlink_to(distribution, target_is_directory=True)
    return tmp_path


def test_the_local_stack_registry_serves_evolving_avro_schemas_on_loopback_and_down_stops_it(own_stack: Path):
    url = stack.registry()
    try:
        state = json.loads((own_stack / "devstack" / "state.json").read_text())
        pid, port = state["registry_pid"], state["registry_port"]
        assert url == f"http://127.0.0.1:{port}{CCOMPAT_PATH}"
        assert f"export {SCHEMA_REGISTRY_URL_ENV}='{url}'\n" in (own_stack / "devstack" / "env.sh").read_text()
        assert (own_stack / "devstack" / "registry" / "registry.log").stat().st_size > 0
        assert stack.registry() == url, "a live registry is reused"
        assert json.loads((own_stack / "devstack" / "state.json").read_text())["registry_pid"] == pid

        # The Confluent-compatible API, as a Confluent serializer uses it.
        assert call(f"{url}/subjects") == (200, [])
        # BACKWARD by default, as Confluent's (issue 64): no compatibility set for the subject, and the incompatible
        # version below is refused (Apicurio's default global rule; its `GET /config` reports only rules set since).
        assert COMPATIBILITY == "BACKWARD"
        status, first = register(url, V1)
        assert status == 200
        status, second = register(url, V2)  # a field with a default: readers of v2 still read v1's records
        assert status == 200 and second["id"] != first["id"]
        assert register(url, V1) == (200, first), "registering a known schema again returns its id"
        status, refused = register(url, INCOMPATIBLE)
        assert status == 409 and refused["error_code"] == 409
        assert call(f"{url}/subjects") == (200, [SUBJECT])
        assert call(f"{url}/subjects/{SUBJECT}/versions") == (200, [1, 2])
        for schema, registered, version in ((V1, first, 1), (V2, second, 2)):
            status, by_id = call(f"{url}/schemas/ids/{registered['id']}")
            assert status == 200 and json.loads(by_id["schema"]) == schema
            status, by_version = call(f"{url}/subjects/{SUBJECT}/versions/{version}")
            assert status == 200 and (by_version["id"], by_version["version"]) == (registered["id"], version)
            assert json.loads(by_version["schema"]) == schema
        status, latest = call(f"{url}/subjects/{SUBJECT}/versions/latest")
        assert status == 200 and (latest["id"], latest["version"]) == (second["id"], 2)
        status, unknown = call(f"{url}/schemas/ids/{second['id'] + 1000}")
        assert status == 404 and unknown["error_code"] == 40403

        # Loopback only: every socket of the JVM (the HTTP port and the transaction manager's own).
        sockets = listening_sockets([pid])
        assert any(s.port == port for s in sockets), sockets
        assert all(s.loopback_only for s in sockets), [str(s) for s in sockets if not s.loopback_only]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert PROCESS_MARKER in cmdline
        assert f"-Dregistry.rules.global.compatibility={COMPATIBILITY}".encode() in cmdline
        assert os.getpgid(pid) == pid, "the JVM leads its own process group, which down stops"
    finally:
        stack.down()
    assert not port_open(port)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    ours = (PROCESS_MARKER.decode(), str(own_stack))
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if all(word in " ".join(p.info["cmdline"] or ()) for
                                                                    word in ours)]
    assert not left, f"registry processes left: {left}"
    state = json.loads((own_stack / "devstack" / "state.json").read_text())
    assert "registry_pid" not in state and state["registry_port"] == port  # the next start reuses the port
    assert SCHEMA_REGISTRY_URL_ENV not in (own_stack / "devstack" / "env.sh").read_text()

