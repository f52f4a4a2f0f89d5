"""Kafka clients of the platform: offsets (discovery, earliest/latest, offsets for times) and security."""
