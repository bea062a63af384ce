from django.apps import AppConfig


class ObservatoryConfig(AppConfig):
    name = "dashboard.observatory"
    label = "observatory"
    verbose_name = "Observatory"

    def ready(self) -> None:
        # Ingest writes notes and wakes whoever registered (derive.notes): the drainer
        # is wired here, so nothing on the ingest side imports it.
        from .derive import notes, runner

        notes.waker_register(runner.notify)
