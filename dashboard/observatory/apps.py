from django.apps import AppConfig


class ObservatoryConfig(AppConfig):
    name = "dashboard.observatory"
    label = "observatory"
    verbose_name = "Observatory"
