"""One connection pool per database in a process, and failures that say what happened.

Every ``PostgresMemory`` on the same URL (the service opens one per memory name) shares
one ``psycopg_pool.ConnectionPool``: connections are checked before use (``check_idle``),
so a server that restarted costs a reconnect, not an error. Waiting is bounded: a pool that cannot hand
out a working connection within ``connect_timeout_s`` raises ``DatabaseUnavailable``
naming the server (never its password), as does a connection lost mid-statement.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from tider.memory.files import StoreError
from tider.memory.pg.config import DatabaseUnavailable, PostgresConfig

_POOLS: dict[tuple, SharedPool] = {}
_POOLS_LOCK = threading.Lock()


def describe_url(url: str) -> str:
    """``postgresql://user@host:port/db`` without the password (for messages and manifests)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        info = conninfo_to_dict(url)
    except psycopg.Error:  # a URL libpq cannot parse: say so without echoing it
        return "postgresql://<unparsable URL>"
    user = f"{info['user']}@" if info.get("user") else ""
    port = f":{info['port']}" if info.get("port") else ""
    return f"postgresql://{user}{info.get('host', 'localhost')}{port}/{info.get('dbname', '')}"


def check_idle(conn) -> None:
    """The pool's check before it hands out ``conn``: a connection the server closed while
    it sat in the pool (a restart, a crash, an idle timeout) has something to read, its
    goodbye or end of file; only then is it asked for real, and replaced if it fails. A
    round trip on every checkout instead (``ConnectionPool.check_connection``) cost a
    search two of them, ~8% of its time at 100k messages. A connection whose server went
    silently (a network partition) fails at its first statement, as one lost mid-statement
    does: ``DatabaseUnavailable``."""
    import select

    from psycopg_pool import ConnectionPool

    if conn.closed or select.select([conn.fileno()], [], [], 0)[0]:
        ConnectionPool.check_connection(conn)


class SharedPool:
    """A ``ConnectionPool`` with pgvector types registered, shared by reference count."""

    def __init__(self, url: str, config: PostgresConfig):
        import psycopg
        from psycopg_pool import ConnectionPool, PoolTimeout

        from tider.memory.pg.schema import migrate

        self.url, self.config, self.where = url, config, describe_url(url)
        self.users = 0
        kwargs = {
            "autocommit": True,
            "connect_timeout": max(2, round(config.connect_timeout_s)),
            "application_name": "tider",
        }
        try:  # the schema first: registering pgvector's types needs the extension
            with psycopg.connect(url, **kwargs) as conn:
                migrate(conn)
        except psycopg.OperationalError as err:
            raise self.unavailable(err) from None
        self.pool = ConnectionPool(
            url,
            min_size=config.pool_min,
            max_size=config.pool_max,
            kwargs=kwargs,
            configure=self._configure,
            check=check_idle,
            timeout=config.connect_timeout_s,
            reconnect_timeout=max(config.connect_timeout_s, 30.0),
            name=f"tider:{self.where}",
            open=False,
        )
        try:
            self.pool.open(wait=True, timeout=config.connect_timeout_s)
        except (PoolTimeout, psycopg.Error) as err:
            self.pool.close()
            raise self.unavailable(err) from None

    def _configure(self, conn) -> None:
        from pgvector.psycopg import register_vector

        register_vector(conn)
        conn.execute(f"SET statement_timeout = {int(self.config.statement_timeout_s * 1000)}")

    def unavailable(self, err: BaseException) -> DatabaseUnavailable:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return DatabaseUnavailable(
            f"PostgreSQL at {self.where} is not reachable (waited up to {self.config.connect_timeout_s:g} s): {reason}"
        )

    @contextlib.contextmanager
    def connection(self) -> Iterator:
        """A checked connection (autocommit; open transactions yourself), errors mapped."""
        import psycopg
        from psycopg_pool import PoolClosed, PoolTimeout

        try:
            with self.pool.connection(timeout=self.config.connect_timeout_s) as conn:
                yield conn
        except psycopg.errors.QueryCanceled as err:
            raise StoreError(f"PostgreSQL at {self.where}: a statement was cancelled ({err})") from None
        except (PoolTimeout, PoolClosed, psycopg.OperationalError, psycopg.InterfaceError) as err:
            raise self.unavailable(err) from None

    @contextlib.contextmanager
    def spare(self, wait_s: float = 0.05) -> Iterator:
        """A second connection for a search that holds one, or None when the pool has none
        to give within ``wait_s`` (a full pool, or one still growing): such a search never
        waits long, so threads that each hold one connection cannot starve each other."""
        import psycopg
        from psycopg_pool import PoolClosed, PoolTimeout

        stats = self.pool.get_stats()
        if stats.get("pool_available", 0) == 0 and stats.get("pool_size", 0) >= self.config.pool_max:
            yield None
            return
        try:
            conn = self.pool.getconn(timeout=wait_s)
        except (PoolTimeout, PoolClosed):
            yield None
            return
        try:
            yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError) as err:
            raise self.unavailable(err) from None
        finally:
            self.pool.putconn(conn)

    def reachable(self, timeout_s: float = 2.0) -> bool:
        """Whether the server answers ``SELECT 1`` within ``timeout_s`` (for /health)."""
        import psycopg
        from psycopg_pool import PoolClosed, PoolTimeout

        try:
            with self.pool.connection(timeout=timeout_s) as conn:
                conn.execute("SELECT 1")
            return True
        except (PoolTimeout, PoolClosed, psycopg.Error):
            return False


def acquire(url: str, config: PostgresConfig) -> SharedPool:
    """The process's pool for ``url`` (created, and the schema migrated, on first use)."""
    key = (url, config)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = SharedPool(url, config)
        pool.users += 1
        return pool


def release(pool: SharedPool) -> None:
    """Drop one user of ``pool``; the last one closes it."""
    with _POOLS_LOCK:
        pool.users -= 1
        if pool.users <= 0 and _POOLS.get((pool.url, pool.config)) is pool:
            del _POOLS[(pool.url, pool.config)]
            pool.pool.close()
