from django.apps import AppConfig


class TuningConfig(AppConfig):
    name = "dashboard.tuning"
    label = "tuning"
    verbose_name = "Tuning"
