from django.apps import AppConfig


class WebConfig(AppConfig):
    """The read side: pages, htmx partials, security headers, the project switcher."""

    name = "dashboard.web"
    label = "web"
    verbose_name = "Pages"
