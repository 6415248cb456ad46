"""Policy engines: the embedded OPA server that ckptgate owns, or a remote OPA.

Both are queried over HTTP (:mod:`._http`) with one deadline, ``timeout_s`` (``--opa-timeout``),
for the whole exchange: connect, send, receive and parse.  A server that trickles its answer is
cut off at the deadline.  Every failure to obtain an answer (start-up, connection, timeout, HTTP
error, undefined result) raises :class:`EngineUnavailable`; the caller treats that as deny.
Nothing here interprets a decision: see :mod:`.decision`.

The embedded server:

* listens on a Unix domain socket in its private work directory (mode 0700; the socket 0600),
  never on a TCP port: a loopback port is anybody's to bind, and a process that read the port from
  OPA's command line could bind it while OPA was still loading its bundle and answer every query
  itself.  Only this user can connect to the socket, and only this OPA can answer on it.  It also
  runs with ``--authentication=token --authorization=basic``: the ``system.authz`` policy in the
  bundle admits only a bearer token whose sha256 equals ``CKPTGATE_OPA_TOKEN_SHA256`` in the
  server's own environment; the token is random per start and never written to disk;
* loads the policies as a signed bundle and verifies it (``--verification-key``); a tampered
  bundle makes OPA refuse to start;
* runs with ``TZ=UTC`` and nothing of this process's environment but ``PATH``
  (:data:`~ckptgate.decide.bundle.OPA_ZONE_ENV`): ``"Local"`` in a time builtin is UTC on every machine;
* is built and launched on a keeper thread, so the caller inspects and hashes meanwhile;
* dies with its owner: ``PR_SET_PDEATHSIG`` kills it if ckptgate is killed (even ``kill -9``),
  and :meth:`EmbeddedOpa.close` (context-manager exit, ``atexit``, SIGTERM/SIGINT) stops it;
* works in a private work directory (:func:`ckptgate.workdirs.create_work_dir`) that this process
  holds locked and registered until :meth:`EmbeddedOpa.close`; each start first sweeps the work
  and staging directories that killed runs left (their owners are provably dead).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import os
import secrets
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol
from urllib.parse import urlencode, urlparse

from ckptgate import workdirs
from ckptgate._resources import default_policy_dir
from ckptgate.decide._http import Late, OpaHttp, Unreachable
from ckptgate.decide._opaproc import die_with_parent as _die_with_parent
from ckptgate.decide._opaproc import fd_path as _fd_path
from ckptgate.decide._opaproc import tail as _tail
from ckptgate.decide.bundle import OPA_ZONE_ENV, PolicyBundle, find_opa
from ckptgate.decide.inputs import DecisionInput, sha256_of
from ckptgate.errors import EngineUnavailable

DEFAULT_TIMEOUT_S = 5.0
_LATE_ADVICE = (
    "The decision is deny because none arrived in time. A checkpoint with a very large layout makes a "
    "large policy input: raise --opa-timeout. Otherwise the engine or the machine is overloaded."
)
#: The embedded OPA's socket, in its work directory.
_SOCKET = "opa.sock"


@dataclass(frozen=True, slots=True, kw_only=True)
class RawDecision:
    """What the engine answered, before any interpretation."""

    result: Any
    decision_id: str
    policy_revision: str
    engine: str
    #: every input that shaped the decision (configuration, overlay, extra Rego, trust, policy tree)
    inputs: tuple[DecisionInput, ...] = ()


class PolicyEngine(Protocol):
    """Evaluates one input document at one entrypoint (a ``/``-separated path under ``data``)."""

    def evaluate(self, entrypoint: str, input_doc: dict[str, Any]) -> RawDecision: ...

    def close(self) -> None: ...


class _ClientEngine:
    """Shared query logic over an :class:`OpaHttp`."""

    _client: OpaHttp
    _name: str
    _revision: str
    _inputs: tuple[DecisionInput, ...] = ()

    def evaluate(self, entrypoint: str, input_doc: dict[str, Any]) -> RawDecision:
        package, _, rule = entrypoint.strip("/").rpartition("/")
        # the policies see what shaped their decision, as the records do
        input_doc = {**input_doc, "decision_inputs": [i.to_json() for i in self._inputs]}
        path = f"/v1/data/{package}/{rule}?{urlencode({'provenance': 'true'})}"
        try:  # one deadline for connect, send, receive and parse: a trickled answer is late too
            body = self._client.post_json(path, {"input": input_doc}, time.monotonic() + self._client.timeout)
        except Late as e:
            raise EngineUnavailable(
                "engine.timeout",
                f"the policy engine did not answer within {self._client.timeout:g} s (a late decision is deny)",
                advice=_LATE_ADVICE,
            ) from e
        except Unreachable as e:
            code = "engine.bad_response" if "not JSON" in str(e) else "engine.unreachable"
            raise EngineUnavailable(code, f"the policy engine at {self._name} could not be queried: {e}") from e
        if not isinstance(body, dict) or "result" not in body:
            raise EngineUnavailable(
                "engine.undefined",
                f"the entrypoint data.{package.replace('/', '.')}.{rule} is undefined in the loaded policies (deny)",
            )
        bundles = (body.get("provenance") or {}).get("bundles") or {}
        revisions = sorted({str(b.get("revision", "")) for b in bundles.values() if isinstance(b, dict)})
        reported = ",".join(r for r in revisions if r)
        return RawDecision(
            result=body["result"],
            decision_id=str(body.get("decision_id") or ""),
            policy_revision=reported or self._revision or "unknown",
            engine=self._name,
            inputs=self._decided_with(reported or None),
        )

    def _decided_with(self, reported: str | None) -> tuple[DecisionInput, ...]:
        """The inputs one decision names; a remote engine's carries what it reported of its bundles."""
        return self._inputs


class RemoteOpa(_ClientEngine):
    """An OPA server someone else runs, named by URL (``--opa-url`` or ``CKPTGATE_OPA_URL``)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        inputs: tuple[DecisionInput, ...] = (),
        origin: str = "explicit",
    ) -> None:
        scheme, host, port = _remote_address(url)
        self._client = OpaHttp(host=host, port=port, ssl=scheme == "https", token=token, timeout=timeout_s)
        self._name = remote_engine_name(url)  # Decision.remote reads the scheme
        if not any(i.role == "remote_engine" for i in inputs):  # every decision names the engine that made it
            inputs = (*inputs, remote_engine_input(url, origin))
        self._inputs = inputs
        self._revision = ""
        if not self._client.check_health():
            raise EngineUnavailable(
                "engine.remote.unhealthy", f"the OPA at {self._name} is not healthy or not reachable"
            )

    def _decided_with(self, reported: str | None) -> tuple[DecisionInput, ...]:
        return tuple(
            dataclasses.replace(i, revision=reported) if i.role == "remote_engine" else i for i in self._inputs
        )

    def close(self) -> None:
        """Nothing to release: every exchange closes its own connection."""


def _remote_address(url: str) -> tuple[str, str, int]:
    """The scheme, host and port of the remote OPA at ``url``; a URL that is not ``http(s)://host[:port]``
    and plain http to another host than this one are refused (``engine.remote.*``, a deny)."""
    try:
        parsed = urlparse(url)
        explicit_port = parsed.port  # raises ValueError for a port that is not a number in range
    except ValueError:
        parsed, explicit_port = None, None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise EngineUnavailable(
            "engine.remote.bad_url",
            f"--opa-url must be http(s)://host:port, got {remote_engine_shown(url)!r}",
            advice=f"Pass --opa-url (or set CKPTGATE_OPA_URL to) the server's https://HOST:PORT; "
            f"{remote_engine_shown(url)!r} is not one.",
        )
    if parsed.scheme == "http" and parsed.hostname not in ("127.0.0.1", "::1", "localhost"):
        raise EngineUnavailable(
            "engine.remote.insecure",
            f"{remote_engine_shown(url)!r} is plain http to another host: the bearer "
            "token and the decisions would travel unprotected; use https",
            advice=f"Pass --opa-url https://{parsed.hostname}:PORT (OPA served over TLS), or reach it "
            "through a loopback tunnel: --opa-url http://127.0.0.1:PORT.",
        )
    return parsed.scheme, parsed.hostname, explicit_port or (443 if parsed.scheme == "https" else 80)


def remote_engine_shown(url: str) -> str:
    """``url`` as an error may quote it: without the user name, password, query or fragment it may carry.

    Everything up to the last ``@`` is dropped first, wherever it is: a URL with no ``://``
    (``//bob:pw@host``, ``bob:pw@host:8181``, ``https:/bob:pw@host``) or a password holding a ``/``,
    ``?`` or ``#`` is exactly the malformed URL an error quotes."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" in rest:
        rest = "…@" + rest.rpartition("@")[2]
    rest = rest.split("#", 1)[0].split("?", 1)[0]  # a token may ride in the query
    return f"{scheme}{sep}{rest}"


def remote_engine_name(url: str) -> str:
    """The remote OPA at ``url`` as decisions, receipts and reports name it: ``scheme://host:port``,
    never the credentials, path, query or fragment the URL may carry (a token in ``?token=``)."""
    scheme, host, port = _remote_address(url)
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def remote_engine_input(url: str, origin: str) -> DecisionInput:
    """The decision input that names the remote OPA at ``url`` (``origin``: who named it): its name,
    and the sha256 of that name.  Its policies, data and trust are the server's, which ckptgate never
    reads; what the server reports of its bundles is added to each decision (``revision``)."""
    name = remote_engine_name(url)
    return DecisionInput(role="remote_engine", path=name, origin=origin, sha256=sha256_of(name.encode()))


class EmbeddedOpa(_ClientEngine):
    """A local OPA server owned by this process.  Use as a context manager."""

    _live: ClassVar[set[EmbeddedOpa]] = set()

    def __init__(
        self,
        *,
        bundle: PolicyBundle | None = None,
        policy_dir: Path | None = None,
        overlays: dict[str, bytes] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        start_timeout_s: float = 30.0,
        log_path: Path | None = None,
        wait: bool = True,
        inputs: tuple[DecisionInput, ...] = (),
        files: dict[str, bytes] | None = None,
    ) -> None:
        """Build the bundle and launch OPA on a keeper thread.  With ``wait=False`` the wait for the
        bundle and for OPA to become healthy is left to the first :meth:`evaluate`, so the caller's
        own work overlaps both; a failure to build or launch is raised there.  ``files`` is the
        snapshot of ``policy_dir`` (:func:`~ckptgate.decide.bundle.read_policy_files`) that ``inputs``
        name, staged as read (taken when the bundle is built when not given)."""
        self._inputs = inputs
        self._lease = workdirs.create_work_dir()  # mode 0700, locked and registered until close()
        self._workdir = self._lease.path
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir_fd = -1  # the work directory, for the socket's address (:meth:`_launch`)
        self._closed = False
        self._started = False
        self._revision = bundle.revision if bundle else ""
        self._timeout_s, self._start_timeout_s = timeout_s, start_timeout_s
        self._log_path = log_path or self._workdir / "opa.log"
        self._ready, self._stop = threading.Event(), threading.Event()
        self._starting = threading.Lock()
        self._failure: BaseException | None = None
        self._staged = ("", "")  # (staged bundle directory, the policy directory it was staged from)
        _install_cleanup()  # signal handlers can only be set from the main thread
        self._keeper = threading.Thread(
            target=self._keep, args=(bundle, policy_dir, overlays, files), name="ckptgate-opa", daemon=True
        )
        EmbeddedOpa._live.add(self)  # until close(): a signal even during the bundle's staging removes the workdir
        self._keeper.start()
        if wait:
            try:
                self._ensure_started()
            except BaseException:
                self.close()
                raise

    def _keep(
        self,
        bundle: PolicyBundle | None,
        policy_dir: Path | None,
        overlays: dict[str, bytes] | None,
        files: dict[str, bytes] | None = None,
    ) -> None:
        """Build the bundle and launch OPA, then stay alive until :meth:`close`: OPA's PDEATHSIG
        follows the thread that forked it, so only this thread, which outlives the server, forks it."""
        try:
            workdirs.sweep()  # what killed runs left: their owners are provably dead (see ckptgate.workdirs)
            if bundle is None:
                source = policy_dir or default_policy_dir()
                bundle = PolicyBundle.from_directory(source, self._workdir, overlays=overlays, files=files)
                self._revision = bundle.revision
                self._staged = (str(bundle.path), str(source))  # OPA's errors name the staged copy
            self._bundle = bundle
            if not self._stop.is_set():
                self._launch()
        except BaseException as e:  # raised again in the caller's thread by _ensure_started
            self._failure = self._launch_failure(e)
        finally:
            self._ready.set()
        self._stop.wait()  # until close(): OPA's PDEATHSIG follows the thread that forked it

    def _launch_failure(self, e: BaseException) -> BaseException:
        """What the caller raises for a failure to prepare or launch OPA: an I/O error (EFBIG, ENOSPC
        in the private work directory; EAGAIN, ENOMEM at fork) is no engine, which is a deny."""
        if isinstance(e, OSError):
            return EngineUnavailable(
                "engine.opa.start_failed",
                f"the embedded OPA could not be prepared or launched: {e.strerror or e}",
                evidence={"workdir": str(self._workdir)},
            )
        return e

    def evaluate(self, entrypoint: str, input_doc: dict[str, Any]) -> RawDecision:
        self._ensure_started()
        return super().evaluate(entrypoint, input_doc)

    def _ensure_started(self) -> None:
        if self._started:
            return
        with self._starting:  # one caller at a time waits for the start
            if self._started:
                return
            self._wait_ready()
            if self._failure is not None:
                self.close()
                raise self._failure
            try:
                self._wait_healthy()
            except EngineUnavailable:
                self.close()
                raise
            self._started = True

    def _wait_ready(self) -> None:
        """Wait for the keeper's launch; :meth:`close` meanwhile ends the wait (``engine.opa.closed``)."""
        while not self._ready.wait(0.05):
            if self._closed:
                break
        if self._closed:
            raise EngineUnavailable("engine.opa.closed", "the embedded OPA has been stopped")

    @property
    def pid(self) -> int | None:
        """The server's pid once the keeper has launched it (waits for that); ``None`` if it failed."""
        self._ready.wait()
        return self._proc.pid if self._proc else None

    def _launch(self) -> None:
        token = secrets.token_urlsafe(32)
        # OPA binds the socket by a path relative to the work directory (its cwd), and this process connects
        # through a descriptor of that directory: a Unix socket address holds at most 107 bytes, which a
        # work directory under a deep TMPDIR or XDG_RUNTIME_DIR would exceed
        self._dir_fd = os.open(self._workdir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        sock = f"{_fd_path(self._dir_fd)}/{_SOCKET}"
        env = {
            "PATH": os.environ.get("PATH", ""),
            "CKPTGATE_OPA_TOKEN_SHA256": hashlib.sha256(token.encode()).hexdigest(),
            **OPA_ZONE_ENV,  # "Local" is UTC: a decision does not depend on this machine's zone
        }
        cmd = [
            find_opa(),
            "run",
            "--server",
            "--addr",
            f"unix://{_SOCKET}",
            "--unix-socket-perm",
            "600",
            "--authentication=token",
            "--authorization=basic",
            "--bundle",
            str(self._bundle.path),
            "--verification-key",
            str(self._bundle.verification_key),
            "--signing-alg",
            "ES256",
            "--set",
            "decision_logs.console=true",
            "--skip-version-check",
            "--shutdown-grace-period",
            "1",
            "--log-level",
            "info",
        ]
        with open(self._log_path, "ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                cwd=self._workdir,
                preexec_fn=_die_with_parent,
                process_group=0,  # Ctrl-C in a terminal reaches ckptgate, which then stops OPA itself
                close_fds=True,
            )
        self._name = f"embedded OPA (pid {self._proc.pid}, {self._workdir / _SOCKET})"
        self._socket, self._token = sock, token
        self._deadline = time.monotonic() + self._start_timeout_s

    def _wait_healthy(self) -> None:
        assert self._proc is not None
        self._client = OpaHttp(
            host="localhost", port=0, token=self._token, timeout=self._timeout_s, unix_path=self._socket
        )
        while True:  # asked at least once: the first decision may come long after the launch (a large digest)
            if self._proc.poll() is not None:
                raise EngineUnavailable(
                    "engine.opa.start_failed",
                    f"the embedded OPA exited during start-up (code {self._proc.returncode}): "
                    f"{_tail(self._log_path).replace(*self._staged)}",
                    advice="OPA refuses to start on a policy that does not compile (fix it; `opa check` "
                    "names the line) and on a bundle whose signature does not verify (rebuild it with "
                    "`ckptgate policy build`, or use the policies directory).",
                )
            if self._client.check_health():  # each probe within --opa-timeout, whole exchange
                return
            if time.monotonic() >= self._deadline:
                break
            time.sleep(0.02)
        raise EngineUnavailable(
            "engine.opa.start_timeout", f"the embedded OPA did not become healthy within {self._start_timeout_s:g} s"
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._keeper is not threading.current_thread() and self._keeper.ident is not None:
            self._keeper.join()  # a launch in progress finishes first, so no server outlives close()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=3)
        EmbeddedOpa._live.discard(self)
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1
        self._lease.release()  # our private directory (the bundle, its public key, the log), then its lock

    def __enter__(self) -> EmbeddedOpa:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_engine(
    *,
    opa_url: str | None = None,
    opa_token: str | None = None,
    policy_dir: Path | None = None,
    bundle: PolicyBundle | None = None,
    overlays: dict[str, bytes] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    inputs: tuple[DecisionInput, ...] = (),
    files: dict[str, bytes] | None = None,
) -> PolicyEngine:
    """The remote OPA named by ``opa_url`` (or ``$CKPTGATE_OPA_URL``), else the embedded default;
    ``inputs`` are named in every decision it makes."""
    url = opa_url or os.environ.get("CKPTGATE_OPA_URL")
    if url:
        token = opa_token or os.environ.get("CKPTGATE_OPA_TOKEN")
        origin = "explicit" if opa_url else "environment"
        return RemoteOpa(url, token=token, timeout_s=timeout_s, inputs=inputs, origin=origin)
    return EmbeddedOpa(
        bundle=bundle,
        policy_dir=policy_dir,
        overlays=overlays,
        timeout_s=timeout_s,
        wait=False,
        inputs=inputs,
        files=files,
    )


def _close_all() -> None:
    for engine in list(EmbeddedOpa._live):
        engine.close()


def _on_signal(signum: int, _frame: object) -> None:
    _close_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


@functools.cache
def _install_cleanup() -> None:
    """On the first launch (not at import): stop every embedded OPA at exit and on SIGTERM/SIGHUP,
    where those signals still have their default action."""
    atexit.register(_close_all)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _on_signal)
