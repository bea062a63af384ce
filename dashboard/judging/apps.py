from django.apps import AppConfig


class JudgingConfig(AppConfig):
    """Judging what agents did: scores (from the API, the pages and OpenTelemetry
    evaluation events), the project's score configs, review queues and datasets."""

    name = "dashboard.judging"
    label = "judging"
    verbose_name = "Judging"

    def ready(self) -> None:
        # Scores that arrived before what they judge are linked by a pass run after
        # the derivations' own (observatory.derive.extra): registered here, so the
        # derivations import nothing of judging.
        from dashboard.observatory.derive.extra import pass_register

        from .links import PASS

        pass_register(PASS)
