"""The local stack for development and tests (a module per service), sample data and the local environment.

Imported by no production code: not by phases/, sinks/, airflow/ or ledger/.
"""
