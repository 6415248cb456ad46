"""Helpers for end-to-end intake tests: a throwaway signing key, trust data naming only it, and a
qualification statement for a fixture's measured digest (as ``ckptgate.demo`` does)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from datetime import timedelta
from pathlib import Path
from typing import Any

from ckptgate.decide import now_utc
from ckptgate.digest import Digest, fixture_digest
from ckptgate.evidence.fixtures import Fixture
from ckptgate.inspect import SafeTree
from ckptgate.decide.options import EngineOptions
from ckptgate.verify import QUALIFICATION_PREDICATE_TYPE, KeySigner, generate_keypair, trust_entry
from ckptgate.verify.statement import qualification_statement
from ckptgate.verify.dsse import sign_statement

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "data"
GATES = json.loads((REPO / "policies" / "ckptgate" / "config" / "gates" / "data.json").read_text())


@dataclass(frozen=True, slots=True, kw_only=True)
class Signer:
    key_path: Path
    trust_file: Path

    @property
    def options(self) -> EngineOptions:
        return EngineOptions(trust_file=self.trust_file)


def make_signer(workdir: Path) -> Signer:
    private_pem, public_pem = generate_keypair("ed25519")
    key_path = workdir / "throwaway-key.pem"
    key_path.write_bytes(private_pem)
    key_path.chmod(0o600)
    trust_file = workdir / "trust.json"
    trust_file.write_text(json.dumps({"signers": [trust_entry(public_pem, signer_id="test-throwaway-key",
                                                              predicate_types=[QUALIFICATION_PREDICATE_TYPE])]}))
    return Signer(key_path=key_path, trust_file=trust_file)


def producer_for(fmt: str, meta: dict[str, Any]) -> tuple[str, str, str]:
    """(adapter, producer name, producer version) for a format, from the policy's gates and the
    versions the fixture's meta.json records."""
    adapter = (GATES["formats"].get(fmt) or {}).get("adapter") or "hf-safetensors"
    gate = GATES["adapters"].get(adapter, {"producer": "*"})
    name = gate["producer"] if gate["producer"] != "*" else "huggingface_hub"
    versions = meta.get("versions", {})
    return adapter, name, str(versions.get(name, versions.get("huggingface_hub", "0")))


def topology_for(meta: dict[str, Any]) -> dict[str, Any]:
    """The predicate topology of a fixture's ``meta.json`` (as ``ckptgate qualify`` records it), else
    tp=1 pp=1 dp=2 cp=1 ep=1 etp=1 world_size=2."""
    if isinstance(meta.get("topology"), dict):
        return Fixture.topology(SimpleNamespace(meta=meta))  # type: ignore[arg-type]
    return {"tp": 1, "pp": 1, "dp": 2, "cp": 1, "ep": 1, "etp": 1, "world_size": 2}


def qualification(src: Path, digest: Digest | str, *, fmt: str, meta: dict[str, Any], issued_at: Any = None,
                  version: str | None = None) -> dict[str, Any]:
    """A passing qualification statement of ``fmt``'s adapter for the checkpoint ``src`` whose
    measured digest is ``digest``, at the fixture's own topology, valid for one hour from
    ``issued_at`` (now by default); ``version`` names another producer release than the fixture's."""
    adapter, name, recorded = producer_for(fmt, meta)
    version = version or recorded
    return qualification_statement(
        subject_name=src.parent.name, fixture_digest=digest if isinstance(digest, Digest) else Digest.parse(digest), manifest=src.parent.name,
        producer={"name": name, "version": version}, adapter={"name": adapter, "version": "1"},
        candidate_commit="0" * 40,
        environment={"python": platform.python_version(), "torch": "2.13.0", "os": "linux",
                     "arch": platform.machine(), "accelerator": "cpu"},
        topology=topology_for(meta),
        status="passed", checks_run=["bit-exact"], evidence_digest=str(digest), evidence_location="test",
        issued_at=issued_at or now_utc(), valid_for=timedelta(hours=1))


def attest(signer: Signer, src: Path, out: Path, *, fmt: str, meta: dict[str, Any], version: str | None = None) -> Path:
    """Sign a qualification statement for the measured digest of ``src`` (naming producer release
    ``version``, else the fixture's); return its path."""
    with SafeTree.open(src) as tree:
        digest = fixture_digest(tree).digest.prefixed()
    statement = qualification(src, digest, fmt=fmt, meta=meta, version=version)
    out.write_bytes(sign_statement(statement, KeySigner.from_pem(signer.key_path)))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Attested:
    trust: Path
    attestation: Path
    public_pem: bytes


def demo_attested(src: Path, workdir: Path, *, name: str = "att") -> Attested:
    """A trust file (``workdir/trust.json``) naming one throwaway Ed25519 key (``name.pem``), and
    that key's demo qualification of ``src``'s measured digest (``name.json``), as ``ckptgate demo``
    signs it."""
    from ckptgate.demo import demo_statement

    private_pem, public_pem = generate_keypair("ed25519")
    key = workdir / f"{name}.pem"
    key.write_bytes(private_pem)
    key.chmod(0o600)
    trust = workdir / "trust.json"
    trust.write_text(json.dumps({"signers": [trust_entry(public_pem, signer_id="test-key",
                                                         predicate_types=[QUALIFICATION_PREDICATE_TYPE])]}))
    with SafeTree.open(src) as tree:
        digest = fixture_digest(tree).digest
    attestation = workdir / f"{name}.json"
    attestation.write_bytes(sign_statement(demo_statement(digest, "hf_sharded",
                                                          producer=("huggingface_hub", "2.4.0")),
                                           KeySigner.from_pem(key)))
    return Attested(trust=trust, attestation=attestation, public_pem=public_pem)


def ckptgate_json(*args: object, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m ckptgate ARGS --json`` in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "ckptgate", *map(str, args), "--json"], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ))


def renice_permitted() -> bool:
    """Whether a thread may make itself nicer here (a sandbox's filter may refuse setpriority;
    the digest's yielding is advisory there, and the tests of it skip)."""
    import threading

    out: list[bool] = []

    def probe() -> None:
        tid = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + 1))
            out.append(True)
        except OSError:
            out.append(False)

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return out[0]
