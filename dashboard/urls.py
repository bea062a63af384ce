"""URL routes: the admin, login, the one NinjaAPI (/api/v1/..., docs at /api/docs),
and OTLP ingest at /v1/traces, /v1/logs and /v1/metrics (the paths OTLP/HTTP exporters post to)."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from dashboard.accounts.views import LoginView, admin_login_throttled
from dashboard.api import api
from dashboard.ingest import otlp_views

admin_login_throttled(admin.site)  # the admin's log-in shares the pages' throttle and its 429

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/", api.urls),
    path("v1/traces", otlp_views.export_traces, name="otlp_traces"),
    path("v1/logs", otlp_views.export_logs, name="otlp_logs"),
    path("v1/metrics", otlp_views.export_metrics, name="otlp_metrics"),
    path("", include("dashboard.web.urls")),  # the pages (dashboard/web)
]
