"""Read-only views of the ledger for operators: the CLI and the Airflow UI page both use these.

Every function takes the caller's session and returns plain dataclasses, ready for a Rich table, JSON or a web
page. One module per what they serve: `status`, `history`, `sinks`, `charts`, `metrics`, `dead_letters`;
`ledger/queries.py` re-exports them all under their old names.
"""
