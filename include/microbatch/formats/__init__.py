"""Formats of a record's key and value: how the platform decodes the bytes into typed columns in the read.

`base.py` is the interface, one module per format implements it (`raw`, `text`, `json`), `registry.py` maps the
spec's `format` to its class, `record.py` names the columns a job gets. Avro or JSON Schema through a registry,
or Debezium envelopes, are each one more module and one more entry in `registry.FORMATS`. `microbatch new
--from-topic` asks each format whether a sample looks like it and what it infers from it (`inference.py`; the
json format's reading in `json_inference.py`, over the type lattice of `json_types.py`).
"""
