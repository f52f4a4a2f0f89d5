"""The offset ledger: models, the repository (session in, never commits) and migrations."""
