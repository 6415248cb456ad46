"""The embedded OPA server: owned, authenticated, signed, and fail-closed."""

from __future__ import annotations

import http.server
import json
import os
import signal
import stat
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
import typing
from pathlib import Path

import pytest
import requests

from ckptgate.decide.bundle import PolicyBundle, build_signed, find_opa, policy_revision
from ckptgate.decide.engine import EmbeddedOpa, RemoteOpa, open_engine
from ckptgate.errors import EngineUnavailable
from tests.opa_front import tcp_front

ECHO = textwrap.dedent("""\
    package ckptgate.intake

    decision := {"allow": input.ok == true, "echo": input}
    """)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); check its state
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_embedded_answers_with_revision_and_decision_id(policy_dir):
    root = policy_dir(ECHO)
    with EmbeddedOpa(policy_dir=root) as opa:
        raw = opa.evaluate("ckptgate/intake/decision", {"ok": True})
    assert raw.result["allow"] is True
    assert raw.result["echo"] == {"ok": True, "decision_inputs": []}  # the engine names its inputs (none here)
    assert raw.policy_revision == policy_revision(root)
    assert raw.decision_id  # decision logging is on, so OPA assigns an id


class _Squatter:
    """Another local process's move: read the embedded OPA's address from the command line of this
    process's own OPA child (world-readable in /proc) and, if it is a loopback port, bind it first
    and answer every request with an allow."""

    ALLOW: typing.ClassVar[dict[str, object]] = {"allow": True, "squatted": True}

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.port: int | None = None
        self.stop = threading.Event()
        self.server: http.server.HTTPServer | None = None
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        squatter = self

        class Answer(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, doc: object) -> None:
                squatter.requests.append(f"{self.command} {self.path}")
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._send({})

            def do_POST(self) -> None:
                self._send({"result": squatter.ALLOW})

        while not self.stop.is_set():
            for proc in Path("/proc").iterdir():
                try:  # only this test's own OPA child, never another run's
                    if not proc.name.isdigit() or int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) != os.getpid():
                        continue
                    argv = (proc / "cmdline").read_bytes().split(b"\0")
                except (OSError, ValueError, IndexError):
                    continue
                if b"--addr" not in argv:
                    continue
                host, _, port = argv[argv.index(b"--addr") + 1].decode().rpartition(":")
                if host != "127.0.0.1":
                    return  # not a TCP port: nothing to squat
                try:
                    self.server = http.server.HTTPServer(("127.0.0.1", int(port)), Answer)
                except OSError:
                    continue
                self.port = int(port)
                threading.Thread(target=self.server.serve_forever, daemon=True).start()
                return
            time.sleep(0.001)

    def close(self) -> None:
        self.stop.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def test_no_other_process_can_answer_for_the_embedded_engine(policy_dir):
    """Attack (session 50): the embedded OPA listened on a loopback port it probed as free, and the
    port was on its command line.  Another local process that read it there bound the port while OPA
    was still loading its bundle; ckptgate then asked that process, sent it the bearer token and
    took its allow (for any input).  The engine now listens on a Unix socket in its 0700 work
    directory, which only this user can reach and only this OPA can bind."""
    squatter = _Squatter()
    try:
        with EmbeddedOpa(policy_dir=policy_dir(ECHO)) as opa:
            raw = opa.evaluate("ckptgate/intake/decision", {"ok": False})
            sock = Path(getattr(opa._client, "unix_path", None) or "")
            mode, dir_mode = (sock.stat().st_mode, sock.parent.stat().st_mode) if sock.name else (0, 0)
    finally:
        squatter.close()
    assert squatter.requests == [] and squatter.port is None
    assert raw.result == {"allow": False, "echo": {"ok": False, "decision_inputs": []}}  # OPA's own answer
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600 and stat.S_IMODE(dir_mode) == 0o700


def test_a_work_directory_deeper_than_a_socket_address_holds_still_serves(policy_dir, tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 100)  # its socket's absolute path is past the 107 bytes an address holds
    deep.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))
    with EmbeddedOpa(policy_dir=policy_dir(ECHO)) as opa:
        assert len(str(opa._workdir / "opa.sock")) > 107
        raw = opa.evaluate("ckptgate/intake/decision", {"ok": True})
        assert raw.result["echo"] == {"ok": True, "decision_inputs": []}  # OPA's own answer, over the socket
    assert opa._dir_fd == -1 and not opa._workdir.exists()  # the directory's descriptor closed, the directory gone


def test_close_ends_a_wait_for_a_relaunch(policy_dir):
    """Review (session 44): a caller waiting for the keeper's relaunch when another thread closes the
    engine gets ``engine.opa.closed``; it does not wait forever for a launch that will not come."""
    opa = EmbeddedOpa(policy_dir=policy_dir(ECHO))
    opa._ready.clear()  # as _ensure_started does before it asks the keeper to relaunch
    threading.Timer(0.2, opa.close).start()
    start = time.monotonic()
    with pytest.raises(EngineUnavailable) as e:
        opa._wait_ready()
    assert e.value.code == "engine.opa.closed" and time.monotonic() - start < 5


def test_embedded_refuses_requests_without_the_owner_token(policy_dir):
    with EmbeddedOpa(policy_dir=policy_dir(ECHO)) as opa, tcp_front(opa) as port:
        url = f"http://127.0.0.1:{port}/v1/data/ckptgate/intake/decision"
        anonymous = requests.post(url, json={"input": {"ok": True}}, timeout=5)
        guessed = requests.post(url, json={"input": {"ok": True}}, timeout=5,
                                headers={"Authorization": "Bearer guessed"})
    assert anonymous.status_code == 401
    assert guessed.status_code == 401


def test_server_stops_on_close(policy_dir):
    opa = EmbeddedOpa(policy_dir=policy_dir(ECHO))
    pid = opa.pid
    assert pid and _alive(pid)
    opa.close()
    assert not _alive(pid)


def test_engine_killed_mid_run_is_unavailable(policy_dir):
    with EmbeddedOpa(policy_dir=policy_dir(ECHO)) as opa:
        os.kill(opa.pid, signal.SIGKILL)
        time.sleep(0.2)
        with pytest.raises(EngineUnavailable) as e:
            opa.evaluate("ckptgate/intake/decision", {"ok": True})
    assert e.value.code == "engine.unreachable"


def test_a_staged_bundle_changed_after_signing_makes_opa_refuse_to_start(policy_dir, tmp_path):
    """The embedded bundle is a signed directory: a changed, an added or a missing file is refused."""
    root = policy_dir(ECHO)
    work = tmp_path / "work"
    work.mkdir()
    good = PolicyBundle.from_directory(root, work)
    assert good.path.is_dir() and not (work / "bundle-signing.pem").exists()  # the private key is gone
    with EmbeddedOpa(bundle=good) as opa:
        assert opa.evaluate("ckptgate/intake/decision", {"ok": True}).result["allow"] is True
    rego = good.path / "ckptgate" / "intake" / "intake.rego"
    original = rego.read_bytes()
    rego.write_bytes(original.replace(b"input.ok == true", b"true"))
    with pytest.raises(EngineUnavailable) as e:
        EmbeddedOpa(bundle=good)
    assert e.value.code == "engine.opa.start_failed" and "digest mismatch" in e.value.message
    rego.write_bytes(original)
    (good.path / "ckptgate" / "intake" / "extra.rego").write_text("package ckptgate.extra\n\nx := 1\n")
    with pytest.raises(EngineUnavailable) as e:
        EmbeddedOpa(bundle=good)
    assert e.value.code == "engine.opa.start_failed" and "not included in bundle signature" in e.value.message
    (good.path / "ckptgate" / "intake" / "extra.rego").unlink()
    rego.unlink()
    with pytest.raises(EngineUnavailable) as e:
        EmbeddedOpa(bundle=good)
    assert e.value.code == "engine.opa.start_failed" and "not found in the target bundle" in e.value.message


def test_tampered_maintainer_bundle_makes_opa_refuse_to_start(policy_dir, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    root = policy_dir(ECHO)
    key = ec.generate_private_key(ec.SECP256R1())
    key_path, pub_path = tmp_path / "maintainer.pem", tmp_path / "maintainer.pub"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    pub_path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                       serialization.PublicFormat.SubjectPublicKeyInfo))
    good = tmp_path / "good.tar.gz"
    assert build_signed(root, good, signing_key=key_path) == policy_revision(root)
    tampered = tmp_path / "tampered.tar.gz"
    with tarfile.open(good) as src, tarfile.open(tampered, "w:gz") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read() if member.isfile() else None
            if member.name.endswith("intake.rego"):
                data = data.replace(b"input.ok == true", b"true")
                member.size = len(data)
            dst.addfile(member, None if data is None else __import__("io").BytesIO(data))
    with pytest.raises(EngineUnavailable) as e:
        EmbeddedOpa(bundle=PolicyBundle.from_signed_file(tampered, pub_path))
    assert e.value.code == "engine.opa.start_failed"
    # the untampered bundle starts with the same key
    with EmbeddedOpa(bundle=PolicyBundle.from_signed_file(good, pub_path)) as opa:
        assert opa.evaluate("ckptgate/intake/decision", {"ok": False}).result["allow"] is False


def test_missing_entrypoint_is_unavailable_not_allow(policy_dir):
    with EmbeddedOpa(policy_dir=policy_dir(ECHO)) as opa:
        with pytest.raises(EngineUnavailable) as e:
            opa.evaluate("ckptgate/intake/nothing_here", {"ok": True})
    assert e.value.code == "engine.undefined"


def test_late_decision_is_a_timeout(policy_dir):
    slow = ECHO + "\nslow := x if {\n\tx := count([i | some i in numbers.range(1, 30000000)])\n}\n"
    with EmbeddedOpa(policy_dir=policy_dir(slow), timeout_s=0.05) as opa:
        with pytest.raises(EngineUnavailable) as e:
            opa.evaluate("ckptgate/intake/slow", {})
    assert e.value.code == "engine.timeout"


def test_remote_engine_is_selected_by_url_and_queried(policy_dir, monkeypatch):
    with EmbeddedOpa(policy_dir=policy_dir(ECHO)) as opa, tcp_front(opa) as port:
        token = opa._client.headers["Authorization"].split()[1]
        monkeypatch.setenv("CKPTGATE_OPA_URL", f"http://127.0.0.1:{port}")
        remote = open_engine(opa_token=token)
        try:
            assert isinstance(remote, RemoteOpa)
            assert remote.evaluate("ckptgate/intake/decision", {"ok": True}).result["allow"] is True
        finally:
            remote.close()


def test_unreachable_remote_is_unavailable():
    with pytest.raises(EngineUnavailable) as e:
        RemoteOpa("http://127.0.0.1:9", timeout_s=0.5)
    assert e.value.code == "engine.remote.unhealthy"


def test_the_embedded_opa_runs_in_a_process_group_of_its_own(policy_dir):
    """A terminal's Ctrl-C reaches ckptgate alone, which then stops OPA itself."""
    with EmbeddedOpa(policy_dir=policy_dir(ECHO)) as opa:
        assert opa.pid is not None
        assert os.getpgid(opa.pid) == opa.pid != os.getpgid(0)


def test_no_orphan_when_owner_is_killed(policy_dir, tmp_path):
    """kill -9 of the owning process takes the embedded OPA with it (PR_SET_PDEATHSIG)."""
    root = policy_dir(ECHO)
    pidfile = tmp_path / "opa.pid"
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from ckptgate.decide.engine import EmbeddedOpa
        opa = EmbeddedOpa(policy_dir=Path({str(root)!r}))
        Path({str(pidfile)!r}).write_text(str(opa.pid))
        time.sleep(60)
        """)
    tmp = tmp_path / "tmp"  # where the killed owner's work directory stays: pytest's, not /tmp
    tmp.mkdir()
    owner = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "TMPDIR": str(tmp)})
    try:
        deadline = time.monotonic() + 30
        while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)  # until the owner has finished writing the pid, not just created the file
        opa_pid = int(pidfile.read_text())
        assert _alive(opa_pid)
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 5
        while _alive(opa_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(opa_pid)
    finally:
        owner.kill()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_the_bundle_is_staged_leaves_no_work_directory(policy_dir, tmp_path, signum):
    """The engine is registered for clean-up before its keeper stages the bundle; it used to be
    registered only at launch, so a signal in the first 0.2-0.3 s left the directory behind."""
    root = policy_dir(ECHO)
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o700)
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from ckptgate.decide import bundle
        from ckptgate.decide.engine import EmbeddedOpa
        staged = bundle.PolicyBundle.from_directory.__func__

        def slow(cls, *args, **kwargs):
            print("staging", flush=True)
            time.sleep(1)
            return staged(cls, *args, **kwargs)

        bundle.PolicyBundle.from_directory = classmethod(slow)
        EmbeddedOpa(policy_dir=Path({str(root)!r}), wait=False)
        time.sleep(30)
        """)
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                             env={**os.environ, "XDG_RUNTIME_DIR": str(tmp)})
    runtime = tmp / "ckptgate"
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == b"staging"
        assert [p.name for p in runtime.iterdir()][0].startswith("opa-")
        owner.send_signal(signum)
        assert owner.wait(timeout=30) == -signum
        assert list(runtime.iterdir()) == []
    finally:
        owner.kill()


def test_the_per_start_signing_key_is_never_on_disk(policy_dir, tmp_path, monkeypatch):
    """At the moment `opa sign` runs (when the old code had written bundle-signing.pem into the work
    directory), no file under any place a work directory can live holds a private key; a kill
    then would leave none behind.  OPA reads the key from an anonymous memory file."""
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o700)
    report, calls = tmp_path / "scan.txt", tmp_path / "calls.txt"
    wrapper = tmp_path / "opa-wrapper"
    wrapper.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = sign ]; then
          echo "$@" >> {calls}
          grep -rl "PRIVATE KEY" {tmp} "$XDG_RUNTIME_DIR" >> {report} 2>/dev/null
        fi
        exec {find_opa()} "$@"
        """))
    wrapper.chmod(0o755)
    monkeypatch.setenv("CKPTGATE_OPA", str(wrapper))
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # where the old code made its work directory
    root = policy_dir(ECHO)
    for _ in range(3):
        with EmbeddedOpa(policy_dir=root) as opa:  # the signature verifies: OPA read the real key
            assert opa.evaluate("ckptgate/intake/decision", {"ok": True}).result["allow"] is True
    assert report.read_text() == ""  # no private key anywhere, while each of the three signed
    signed = calls.read_text().splitlines()
    assert len(signed) == 3 and all("--signing-key /proc/self/fd/" in line for line in signed)


def test_a_signing_key_path_opa_cannot_read_is_a_deny_not_a_key_taken_from_the_path(policy_dir, monkeypatch):
    """`opa sign --signing-key X` takes X itself as the key when no file X exists; the memory file
    must be readable by OPA, or the bundle is not signed at all (build_failed, never a weak key)."""
    from ckptgate.decide import bundle

    real = bundle._opa

    def without_the_key(*args, **kwargs):
        kwargs["pass_fds"] = ()
        return real(*args, **kwargs)

    monkeypatch.setattr(bundle, "_opa", without_the_key)
    with pytest.raises(EngineUnavailable) as e:
        EmbeddedOpa(policy_dir=policy_dir(ECHO))
    assert e.value.code == "engine.bundle.build_failed"


def test_build_signed_bundle_has_signatures(policy_dir, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    pem = tmp_path / "k.pem"
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    out = tmp_path / "b.tar.gz"
    build_signed(policy_dir(ECHO), out, signing_key=pem)
    with tarfile.open(out) as t:
        names = {m.name.lstrip("/") for m in t.getmembers()}
    assert ".signatures.json" in names
    assert "ckptgate/intake/intake.rego" in names
    assert "system/authz/authz.rego" in names


class _Trickler:
    """A local HTTP server that accepts, reads the request, then sends its whole answer (status
    line, headers and body) one byte every ``gap`` seconds; ``/health`` too unless ``health_ok``.
    It records when each request arrived and stops trickling when the client goes away."""

    def __init__(self, *, gap: float, health_ok: bool) -> None:
        import http.server
        import threading

        self.arrived: dict[str, float] = {}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, body: bytes, trickle: bool) -> None:
                raw = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                       b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
                if not trickle:
                    self.wfile.write(raw)
                    return
                for byte in raw:
                    try:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                    except OSError:
                        return
                    time.sleep(gap)

            def do_GET(self):
                outer.arrived.setdefault("GET", time.monotonic())
                self._answer(b"{}", trickle=not health_ok)

            def do_POST(self):
                outer.arrived.setdefault("POST", time.monotonic())
                self.rfile.read(int(self.headers["Content-Length"]))
                self._answer(b'{"result": {"allow": true, "plane": null, "permitted_loaders": [], '
                             b'"required_controls": [], "reasons": []}}', trickle=True)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def trickler():
    made: list[_Trickler] = []

    def make(*, gap: float = 0.5, health_ok: bool = True) -> _Trickler:
        made.append(_Trickler(gap=gap, health_ok=health_ok))
        return made[-1]

    yield make
    for t in made:
        t.close()


def test_a_trickled_answer_is_cut_off_at_the_deadline(trickler):
    """One deadline bounds the whole exchange: a server trickling its answer (headers included)
    byte by byte, each byte well inside any per-read timeout, is abandoned at the deadline."""
    server = trickler(gap=0.25)
    remote = RemoteOpa(server.url, timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(EngineUnavailable) as e:
        remote.evaluate("ckptgate/intake/decision", {})
    elapsed = time.monotonic() - t0
    assert e.value.code == "engine.timeout" and e.value.exit_code == 6
    assert 0.9 < elapsed < 1.0 + 3


def test_a_trickled_health_answer_is_cut_off_at_the_deadline(trickler):
    server = trickler(gap=0.25, health_ok=False)
    t0 = time.monotonic()
    with pytest.raises(EngineUnavailable) as e:
        RemoteOpa(server.url, timeout_s=1.0)
    assert e.value.code == "engine.remote.unhealthy"
    assert time.monotonic() - t0 < 1.0 + 3


def test_the_embedded_engine_cuts_a_trickled_answer_at_the_deadline(policy_dir, trickler):
    """The embedded engine asks through the same client; pointed at a trickling server after
    start-up (the only seam: its own OPA never trickles), it is cut off at the deadline too."""
    server = trickler(gap=0.25)
    with EmbeddedOpa(policy_dir=policy_dir(ECHO), timeout_s=1.0) as opa:
        assert opa.evaluate("ckptgate/intake/decision", {"ok": True}).result["allow"] is True
        opa._client.unix_path, opa._client.port = None, server.port  # the same client, now over TCP
        t0 = time.monotonic()
        with pytest.raises(EngineUnavailable) as e:
            opa.evaluate("ckptgate/intake/decision", {"ok": True})
        elapsed = time.monotonic() - t0
    assert e.value.code == "engine.timeout" and elapsed < 1.0 + 3


@pytest.mark.parametrize("health_ok", [True, False])
def test_decide_with_a_trickling_opa_url_fails_closed_within_the_timeout(trickler, health_ok):
    """`decide --opa-timeout 2` against a server sending one byte per second: exit 6, a typed
    code, and the command ends within the timeout plus slack after the server was asked."""
    server = trickler(gap=1.0, health_ok=health_ok)
    hf = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "hf_sharded" / "checkpoint"
    res = subprocess.run([sys.executable, "-m", "ckptgate", "decide", str(hf), "--opa-url", server.url,
                          "--opa-timeout", "2", "--json"], capture_output=True, text=True, timeout=300)
    ended = time.monotonic()
    assert res.returncode == 6, res.stderr
    err = json.loads(res.stdout)["error"]
    assert err["code"] == ("engine.timeout" if health_ok else "engine.remote.unhealthy")
    asked = server.arrived["POST" if health_ok else "GET"]
    assert ended - asked < 2 + 3


def test_plain_http_to_another_host_is_refused():
    with pytest.raises(EngineUnavailable) as e:
        RemoteOpa("http://opa.example.com:8181")
    assert e.value.code == "engine.remote.insecure"


@pytest.mark.parametrize("url", ["http://127.0.0.1:notaport", "http://127.0.0.1:99999", "http://[::1", "ftp://x:1",
                                 "127.0.0.1:8181"])
def test_a_malformed_remote_url_is_a_typed_error(url: str) -> None:
    with pytest.raises(EngineUnavailable) as e:
        RemoteOpa(url)
    assert e.value.code == "engine.remote.bad_url"


def test_asking_the_engine_loads_no_http_library_beyond_the_standard_one():
    """The engine speaks HTTP with http.client under one deadline: neither opa_client, requests
    nor aiohttp (about 0.3 s of CPU on import, which would slow the digest it overlaps) is loaded."""
    code = ("import sys, ckptgate.pipeline, ckptgate.decide.options as p; "
            "e = p.open_engine(); e.evaluate('ckptgate/intake/decision', {}); e.close(); "
            "print(*[m in sys.modules for m in ('opa_client', 'requests', 'aiohttp')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "False", "False"]


def test_a_policy_that_does_not_compile_is_raised_at_the_first_decision_and_leaves_nothing(policy_dir):
    """The keeper thread stages and launches while the caller works; OPA refuses the policy at
    start-up, and that is a typed deny carrying OPA's own error."""
    root = policy_dir("package ckptgate.intake\n\ndecision := {\n")
    engine = open_engine(policy_dir=root)
    workdir = engine._workdir
    with pytest.raises(EngineUnavailable) as e:
        engine.evaluate("ckptgate/intake/decision", {"ok": True})
    assert e.value.code == "engine.opa.start_failed" and "rego_parse_error" in e.value.message
    assert f"{root}/ckptgate/intake/intake.rego:4" in e.value.message  # the user's file, not the staged copy
    assert str(workdir) not in e.value.message
    assert not EmbeddedOpa._live and not workdir.exists()
    engine.close()  # closing again is harmless


def test_a_first_decision_long_after_the_launch_still_finds_the_server(policy_dir):
    """The start-up deadline runs from the launch; a digest that outlasts it must not turn a
    healthy server into engine.opa.start_timeout (the health check is asked at least once)."""
    with EmbeddedOpa(policy_dir=policy_dir(ECHO), wait=False, start_timeout_s=0.5) as opa:
        time.sleep(2.0)  # the caller inspects and hashes meanwhile
        assert opa.evaluate("ckptgate/intake/decision", {"ok": True}).result is not None


def test_the_embedded_opa_reads_local_time_as_utc_on_every_machine(policy_dir):
    """``"Local"`` in a time builtin is the OPA process's zone: with the host's ``/etc/localtime`` (no ``TZ``)
    a decision differed between machines; the engine runs with ``TZ=UTC`` and no ``ZONEINFO``."""
    zone = ECHO + textwrap.dedent("""\

        zone := {
        \t"tz": object.get(opa.runtime().env, "TZ", null),
        \t"zoneinfo": object.get(opa.runtime().env, "ZONEINFO", null),
        \t"clock": time.clock([0, "Local"]),
        }
        """)
    with EmbeddedOpa(policy_dir=policy_dir(zone)) as opa:
        raw = opa.evaluate("ckptgate/intake/zone", {})
    assert raw.result == {"tz": "UTC", "zoneinfo": None, "clock": [0, 0, 0]}
