from django.apps import AppConfig


class MetricsConfig(AppConfig):
    """The metrics agents send over OTLP (``/v1/metrics``, gRPC MetricsService): the
    GenAI client metrics and the pipeline's own kept per project, model and hour;
    every other metric counted by name."""

    name = "dashboard.metrics"
    label = "metrics"
    verbose_name = "Metrics"
