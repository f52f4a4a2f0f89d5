"""Airflow 3 plugin: the microbatch ledger page, mounted at /microbatch, with a "Ledger" entry in the nav.

Thin on purpose: the page lives in `microbatch.ui`. This file only wires Airflow into it: the
auth dependency (the caller must be logged in and allowed to read DAG runs, like the Runs pages)
and the connections (the environment first, then Airflow's, through `microbatch.airflow.hooks`).
Importing it touches neither the network nor a database.
"""

from __future__ import annotations

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import requires_access_dag
from airflow.plugins_manager import AirflowPlugin

from microbatch.airflow.hooks import kafka_settings, ledger_url
from microbatch.ui import PAGE_PATH, LedgerSources, create_app

URL_PREFIX = "/microbatch"


def _login_url(next_url: str) -> str:
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager().get_url_login(next_url=next_url)


ledger_app = create_app(
    LedgerSources(ledger_url=ledger_url, kafka_settings=kafka_settings),
    auth=requires_access_dag("GET", DagAccessEntity.RUN),
    login_url=_login_url,
)


class MicrobatchLedgerPlugin(AirflowPlugin):
    name = "microbatch_ledger"
    fastapi_apps = [{"app": ledger_app, "url_prefix": URL_PREFIX, "name": "microbatch ledger"}]
    external_views = [
        {
            "name": "Ledger",
            "href": URL_PREFIX.lstrip("/") + PAGE_PATH,
            "destination": "nav",
            "url_route": "microbatch-ledger",  # shown inside the Airflow UI at /plugin/microbatch-ledger
        }
    ]
