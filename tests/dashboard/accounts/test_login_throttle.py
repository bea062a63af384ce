"""Log-in throttling: per account and per client address, on the dashboard's log-in
page and the admin's, across processes (counted in the database)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.accounts.models import LoginThrottle
from dashboard.accounts.throttle import login_throttle_purge
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def limits(settings):
    settings.OBSERVATORY_LOGIN_MAX_FAILURES_PER_ACCOUNT = 3
    settings.OBSERVATORY_LOGIN_MAX_FAILURES_PER_ADDRESS = 5
    settings.OBSERVATORY_LOGIN_LOCKOUT_SECONDS = 600
    return settings


def _login(client, username, password, address="10.0.0.1", path="/accounts/login/"):
    return client.post(path, {"username": username, "password": password}, REMOTE_ADDR=address)


def test_it_locks_an_account_out_after_failures_even_for_the_right_password(client, user, limits):
    for _ in range(3):
        assert _login(client, "ana", "wrong").status_code in (200, 429)
    response = _login(client, "ana", PASSWORD)
    assert response.status_code == 429
    assert b"Too many failed log-ins" in response.content
    assert b"Try again in 10 minutes" in response.content
    assert int(response["Retry-After"]) > 500
    assert "_auth_user_id" not in client.session


def test_it_locks_the_account_from_every_address(client, user, limits):
    for n in range(3):
        _login(client, "ana", "wrong", address=f"10.0.0.{n}")
    assert _login(client, "ana", PASSWORD, address="10.9.9.9").status_code == 429


def test_it_counts_usernames_case_insensitively(client, user, limits):
    for name in ("ana", "ANA", "Ana"):
        _login(client, name, "wrong")
    assert _login(client, "ana", PASSWORD).status_code == 429


def test_it_locks_an_address_out_across_accounts(client, user, other_user, limits):
    for n in range(5):
        _login(client, f"nobody{n}", "wrong", address="10.1.1.1")
    assert _login(client, "bo", PASSWORD, address="10.1.1.1").status_code == 429
    # another address is not affected
    assert _login(client, "bo", PASSWORD, address="10.1.1.2").status_code == 302


def test_it_forgets_failures_after_a_success(client, user, limits):
    for _ in range(2):
        _login(client, "ana", "wrong")
    assert _login(client, "ana", PASSWORD).status_code == 302
    client.logout()
    for _ in range(2):
        _login(client, "ana", "wrong")
    assert _login(client, "ana", PASSWORD).status_code == 302


def test_it_lets_the_account_in_once_the_lockout_is_over(client, user, limits):
    for _ in range(3):
        _login(client, "ana", "wrong")
    LoginThrottle.objects.update(locked_until=timezone.now() - timedelta(seconds=1))
    assert _login(client, "ana", PASSWORD).status_code == 302


def test_it_starts_a_new_window_when_the_old_one_is_over(client, user, limits):
    for _ in range(2):
        _login(client, "ana", "wrong")
    LoginThrottle.objects.update(window_started_at=timezone.now() - timedelta(seconds=601))
    _login(client, "ana", "wrong")  # the first failure of a new window
    assert _login(client, "ana", PASSWORD).status_code == 302


def test_it_throttles_the_admin_login_too(client, django_user_model, limits):
    django_user_model.objects.create_superuser("root", password=PASSWORD)
    for _ in range(3):
        _login(client, "root", "wrong", path="/admin/login/")
    response = _login(client, "root", PASSWORD, path="/admin/login/")
    assert response.status_code == 429 and int(response["Retry-After"]) > 500  # as the pages answer
    assert b"Too many failed log-ins" in response.content
    assert "_auth_user_id" not in client.session


def test_the_admin_login_answers_429_to_wrong_passwords_from_a_fresh_address(client, django_user_model, settings):
    # The settings as shipped: a fresh address is far from its own allowance, so only
    # the account's count can lock it, after the same number of failures as the pages.
    django_user_model.objects.create_superuser("root", password=PASSWORD)
    allowed = settings.OBSERVATORY_LOGIN_MAX_FAILURES_PER_ACCOUNT
    assert allowed < 7 < settings.OBSERVATORY_LOGIN_MAX_FAILURES_PER_ADDRESS
    statuses = [_login(client, "root", f"wrong-{n}", address="198.51.100.23", path="/admin/login/").status_code
                for n in range(7)]
    assert statuses == [200] * (allowed - 1) + [429] * (7 - allowed + 1)
    response = _login(client, "root", PASSWORD, address="198.51.100.23", path="/admin/login/")
    assert response.status_code == 429 and int(response["Retry-After"]) > 0
    assert "_auth_user_id" not in client.session


@pytest.mark.parametrize("fail_on, then_on", [("/admin/login/", "/accounts/login/"),
                                              ("/accounts/login/", "/admin/login/")])
def test_the_admin_and_the_pages_share_one_count(client, django_user_model, limits, fail_on, then_on):
    django_user_model.objects.create_superuser("root", password=PASSWORD)
    _login(client, "root", "wrong", address="10.2.0.1", path=fail_on)
    _login(client, "root", "wrong", address="10.2.0.2", path=then_on)
    assert LoginThrottle.objects.get(scope="account", key="root").failures == 2  # one count, both doors
    # The third failure, on either page, locks the account on both, from any address.
    assert _login(client, "root", "wrong", address="10.2.0.3", path=fail_on).status_code == 429
    assert _login(client, "root", PASSWORD, address="10.2.0.4", path=then_on).status_code == 429
    assert "_auth_user_id" not in client.session


def test_it_reads_the_address_from_the_configured_proxy_header(client, user, limits):
    limits.OBSERVATORY_CLIENT_IP_HEADER = "X-Real-IP"
    for n in range(5):
        client.post("/accounts/login/", {"username": f"x{n}", "password": "no"},
                    REMOTE_ADDR="127.0.0.1", HTTP_X_REAL_IP="203.0.113.7")
    assert client.post("/accounts/login/", {"username": "ana", "password": PASSWORD},
                       REMOTE_ADDR="127.0.0.1", HTTP_X_REAL_IP="203.0.113.8").status_code == 302


def test_it_escapes_a_hostile_username(client, limits):
    response = _login(client, "<script>alert(1)</script>", "x")
    assert b"<script>alert(1)</script>" not in response.content


def test_it_purges_rows_whose_window_and_lockout_are_over(user, limits):
    old = timezone.now() - timedelta(hours=2)
    LoginThrottle.objects.create(scope="account", key="old", failures=2, window_started_at=old)
    LoginThrottle.objects.create(scope="account", key="locked", failures=0, window_started_at=old,
                                 locked_until=timezone.now() + timedelta(minutes=5))
    LoginThrottle.objects.create(scope="address", key="fresh", failures=1)
    assert login_throttle_purge() == 1
    assert set(LoginThrottle.objects.values_list("key", flat=True)) == {"locked", "fresh"}
