"""SLSA provenance v1 statements whose subjects list a checkpoint's files, made with ``in-toto-attestation``
(the in-toto Attestation Framework's Python bindings), and trust data for the key that signs them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
from in_toto_attestation.v1.statement import Statement

from ckptgate.verify import KeySigner, TrustData, trust_entry
from ckptgate.verify.statement import SLSA_PROVENANCE_V1
from tests.verify.verify_helpers import public_pem

BUILDER = "https://github.com/example/trainer/.github/workflows/train.yml@refs/heads/main"


def file_hashes(root: Path) -> dict[str, str]:
    """relpath -> sha256 of every file under ``root`` (what the signer attests)."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def slsa_statement(files: dict[str, str], *, builder: str = BUILDER) -> dict[str, Any]:
    """A SLSA provenance v1 Statement with one subject per file (name, sha256), validated by the bindings."""
    subjects = [ResourceDescriptor(name=name, digest={"sha256": digest}).pb for name, digest in files.items()]
    pred = provenance_pb2.Provenance()  # type: ignore[attr-defined]
    json_format.ParseDict({
        "buildDefinition": {
            "buildType": "https://example.com/trainer/v1",
            "externalParameters": {"config": "configs/run.yaml"},
            "resolvedDependencies": [{"uri": "git+https://github.com/example/trainer@refs/heads/main",
                                      "digest": {"gitCommit": "0123456789abcdef0123456789abcdef01234567"}}],
        },
        "runDetails": {"builder": {"id": builder}, "metadata": {"invocationId": "run-42"}},
    }, pred)
    stmt = Statement(subjects, SLSA_PROVENANCE_V1, json_format.MessageToDict(pred))
    stmt.validate()
    return json.loads(json_format.MessageToJson(stmt.pb))  # type: ignore[no-any-return]


def slsa_trust(s: KeySigner, *, builders: tuple[str, ...] = (BUILDER,), signer_id: str = "release-builder") -> TrustData:
    """Trust data naming ``s`` for SLSA provenance from ``builders``, in scope ``slsa_provenance``."""
    entry = trust_entry(public_pem(s), signer_id=signer_id, predicate_types=[SLSA_PROVENANCE_V1],
                        producers=builders, scopes=("slsa_provenance",))
    return TrustData.from_json(json.dumps({"signers": [entry]}).encode(), source="test")
