"""Everything that imports Airflow: hooks (connections), operators (the stage), dags (the one builder)."""
