"""OTLP metrics: the GenAI client metrics and the pipeline's own, kept per project, model and hour."""
