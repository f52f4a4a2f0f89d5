"""Sinks: one module per sink type behind one interface that the stage and the commit call."""
