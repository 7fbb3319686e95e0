"""A shared campaign's storage URL (``storage:``, tuner/night/shared.py), as text: its schemes,
the form that may be printed (the password masked), and the spellings libpq and SQLAlchemy
want. Pure: readers and writers both use it."""
from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

SCHEMES = ("postgresql", "postgres", "postgresql+psycopg2")


def safe_url(url: str) -> str:
    """The URL as it may be printed: its password replaced by ***."""
    try:
        u = urlsplit(url)
        password = u.password
    except ValueError:
        return "<an unreadable URL>"
    if password is None:
        return url
    netloc = f"{u.username}:***@{u.hostname}" + (f":{u.port}" if u.port else "")
    return urlunsplit((u.scheme, netloc, u.path, u.query, u.fragment))


def without_password(url: str) -> str:
    """The URL with no password at all (libpq then reads PGPASSWORD or ~/.pgpass): what a
    campaign folder's ``shared.json`` keeps."""
    u = urlsplit(url)
    if u.password is None:
        return url
    netloc = f"{u.username}@{u.hostname}" + (f":{u.port}" if u.port else "")
    return urlunsplit((u.scheme, netloc, u.path, u.query, u.fragment))


def dsn(url: str) -> str:
    """The libpq form of a storage URL (``postgresql+psycopg2://`` is SQLAlchemy's spelling)."""
    return "postgresql://" + url.split("://", 1)[1] if "://" in url else url


def sqlalchemy_url(url: str) -> str:
    return "postgresql+psycopg2://" + url.split("://", 1)[1]
