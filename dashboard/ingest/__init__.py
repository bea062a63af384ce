"""Ingest: the thin fast paths agents write to (records, artifacts, OTLP spans) and
the config they read. Authenticate, bound the size, decode, validate, store, answer."""
