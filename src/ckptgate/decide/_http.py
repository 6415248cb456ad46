"""One HTTP exchange with OPA under one deadline: connect, send, receive and parse together.

Socket timeouts bound each operation, not the whole: a server that trickles its answer a byte at
a time resets them forever.  So every exchange here (stdlib :mod:`http.client`) has a watchdog:
when the deadline passes it shuts the socket down, which ends any read or write blocked on it at
once, and the exchange reports that it was late.  The connection is closed whatever happens, so
nothing outlives the call.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ckptgate._json import loads_strict

__all__ = ["Late", "OpaHttp", "Unreachable"]

MAX_ANSWER = 64 << 20  # a decision is small; this bounds memory and the parse
_POLL_S = 0.05


class Late(Exception):
    """The deadline passed before the exchange completed."""


class Unreachable(Exception):
    """The exchange failed before the deadline (refused, reset, HTTP error, not JSON...)."""


@dataclass(slots=True)
class OpaHttp:
    """Where OPA listens and how to authenticate; each call opens and closes its own connection."""

    host: str
    port: int
    ssl: bool = False
    token: str | None = None
    timeout: float = 5.0
    #: a Unix domain socket to connect to instead of ``host:port`` (the embedded OPA's, in its
    #: private work directory: only this user can connect to it, and nobody else can answer on it)
    unix_path: str | None = None
    headers: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def check_health(self, deadline: float | None = None) -> bool:
        """Whether ``GET /health`` answers 200 before the deadline (default: now + timeout)."""
        try:
            status, _ = self._exchange("GET", "/health", None, self._deadline(deadline))
        except (Late, Unreachable):
            return False
        return status == 200

    def post_json(self, path: str, doc: Any, deadline: float | None = None) -> Any:
        """POST ``doc`` as JSON and parse the JSON answer, all before the deadline.  Raises
        :class:`Late` or :class:`Unreachable` (a non-2xx status, or a body that is not JSON)."""
        deadline = self._deadline(deadline)
        body = json.dumps(doc, separators=(",", ":")).encode()
        if time.monotonic() >= deadline:
            raise Late("the input document took the whole deadline to encode")
        status, raw = self._exchange("POST", path, body, deadline)
        if not 200 <= status < 300:
            raise Unreachable(f"HTTP {status}{_opa_error(raw)}")
        try:
            answer = loads_strict(raw, what="the answer")
        except (ValueError, RecursionError) as e:
            raise Unreachable("the answer is not JSON") from e
        if time.monotonic() > deadline:  # parsing counts too
            raise Late("the answer was parsed after the deadline")
        return answer

    def _deadline(self, deadline: float | None) -> float:
        return deadline if deadline is not None else time.monotonic() + self.timeout

    def _exchange(self, method: str, path: str, body: bytes | None, deadline: float) -> tuple[int, bytes]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Late("no time left")
        conn: http.client.HTTPConnection
        if self.unix_path is not None:
            conn = _UnixConnection(self.unix_path, timeout=remaining)
        elif self.ssl:
            conn = http.client.HTTPSConnection(
                self.host, self.port, timeout=remaining, context=ssl.create_default_context()
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=remaining)
        done, expired = threading.Event(), threading.Event()
        watchdog = threading.Thread(
            target=_watch, args=(conn, deadline, done, expired), name="ckptgate-opa-deadline", daemon=True
        )
        watchdog.start()
        try:
            headers = {**self.headers, "Accept": "application/json"}
            if body is not None:
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            raw = resp.read(MAX_ANSWER + 1)
            if len(raw) > MAX_ANSWER:
                raise Unreachable(f"the answer exceeds {MAX_ANSWER} bytes")
            status = resp.status
        except (OSError, http.client.HTTPException, ValueError) as e:
            if expired.is_set() or time.monotonic() >= deadline:
                raise Late(type(e).__name__) from e
            raise Unreachable(type(e).__name__) from e
        finally:
            done.set()
            watchdog.join()
            conn.close()
        if expired.is_set():
            raise Late("the deadline passed")
        return status, raw


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over the Unix domain socket at ``path`` (the ``Host`` header says ``localhost``)."""

    def __init__(self, path: str, *, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _watch(conn: http.client.HTTPConnection, deadline: float, done: threading.Event, expired: threading.Event) -> None:
    """At the deadline, shut down whatever socket the exchange holds (again, until it ends: the
    socket may be created, or wrapped for TLS, just after a first attempt)."""
    if done.wait(max(0.0, deadline - time.monotonic())):
        return
    expired.set()
    while True:
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if done.wait(_POLL_S):
            return


def _opa_error(raw: bytes) -> str:
    """``: <message>`` of OPA's error answer (an evaluation error such as two values for one
    complete rule answers 500 with one), bounded; empty when the body is not one."""
    with contextlib.suppress(ValueError, RecursionError):
        doc = loads_strict(raw[:65536], what="the error answer")
        if isinstance(doc, dict) and isinstance(doc.get("message"), str):
            parts = [doc["message"]]
            errors = doc.get("errors")
            for e in errors if isinstance(errors, list) else []:
                if isinstance(e, dict):
                    parts.append(f"{e.get('code')}: {' / '.join(str(e.get('message')).splitlines())}")
            return f": {'; '.join(parts)[:500]}"
    return ""
