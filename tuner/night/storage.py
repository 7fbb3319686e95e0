"""A shared campaign's storage URL (``storage:``, tuner/night/shared.py), as text: its schemes,
the form that may be printed (the password masked), and the spellings libpq and SQLAlchemy
want (pure: readers and writers both use them); and Optuna's storage opened at a path or URL
(``open_storage``: the night's study and the dashboard open it one way)."""
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


def is_url(path) -> bool:
    """Whether the study lives in a database (a shared campaign's ``storage:``) rather than a file."""
    return isinstance(path, str) and "://" in path


def open_storage(path):
    """Optuna's storage at ``path``: the campaign's journal file, or a shared campaign's database URL."""
    if is_url(path):                 # a shared campaign (tuner/night/shared.py): psycopg2, a small pool
        import psycopg2
        from optuna.storages import RDBStorage

        # Optuna creates its tables when its storage first opens; two boxes (or two campaigns on one
        # database) opening at once race on CREATE TABLE (a duplicate pg_type key): one at a time
        lock = psycopg2.connect(dsn(path), connect_timeout=10)
        try:
            lock.autocommit = True
            with lock.cursor() as cur:
                cur.execute("SELECT pg_advisory_lock(hashtext('offload-tuner optuna schema'))")
            return RDBStorage(sqlalchemy_url(path), engine_kwargs={"pool_size": 2, "max_overflow": 2,
                                                                    "pool_pre_ping": True})
        finally:
            lock.close()             # a session lock ends with its connection
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(path)))
