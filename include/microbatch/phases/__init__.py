"""The phases of a micro-batch: plan -> stage -> commit -> publish, and backfill, reset, reporting."""
