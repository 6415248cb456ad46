"""Issue #16 end to end: a ZeRO-2 checkpoint whose ``mp_rank_00_model_states.pt`` holds
``archive/data.pkl`` (a pickle of ``None``) and then ``archive/DATA.PKL`` (a payload).  Torch's
reader looks records up ignoring ASCII case and reads ``DATA.PKL``; the static reader read
``data.pkl``, called the archive clean, and a trusted qualification let the payload run in the
worker.  Now ``ckptgate inspect`` exits 4, an intake with a trusted qualification is refused with
exit 4, and the payload never runs."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ckptgate.errors import ExitCode
from ckptgate.inspect import SafeTree, inspect_open_tree

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutations import build_zip, zip_members  # noqa: E402
from pipeline_helpers import FIXTURES, attest, make_signer  # noqa: E402

pytestmark = pytest.mark.opa


def _payload(marker: Path) -> bytes:
    """A protocol-2 pickle that calls ``builtins.exec`` to write ``marker``."""
    code = f"open({str(marker)!r}, 'w').write('payload ran')".encode()
    return b"\x80\x02cbuiltins\nexec\nX" + struct.pack("<I", len(code)) + code + b"\x85R."


def _cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptgate", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_data_pkl_then_DATA_PKL_in_zero2_model_states_is_refused_and_never_runs(tmp_path: Path) -> None:
    src = tmp_path / "checkpoint"
    shutil.copytree(FIXTURES / "deepspeed_zero2" / "checkpoint", src)
    victim = src / "global_step2" / "mp_rank_00_model_states.pt"
    marker = tmp_path / "marker"
    members = zip_members(victim.read_bytes())
    i = next(k for k, (n, _) in enumerate(members) if n.endswith("/data.pkl"))
    name = members[i][0]
    members[i] = (name, b"\x80\x02N.")  # what the static reader read
    members.insert(i + 1, (name[:-len("data.pkl")] + "DATA.PKL", _payload(marker)))  # what torch reads
    victim.write_bytes(build_zip(members))

    r = _cli("inspect", src, "--json")
    assert r.returncode == ExitCode.INPUT_REJECTED, r.stdout + r.stderr
    findings = json.loads(r.stdout)["inspection"]["findings"]
    assert {"code": "zip.name_collision", "path": "global_step2/mp_rank_00_model_states.pt"} in \
        [{"code": f["code"], "path": f["path"]} for f in findings if f["severity"] == "error"]

    signer = make_signer(tmp_path)
    with SafeTree.open(src) as tree:
        fmt = str(inspect_open_tree(tree).format)
    assert fmt == "deepspeed-zero2"
    meta = json.loads((FIXTURES / "deepspeed_zero2" / "meta.json").read_text())
    att = attest(signer, src, tmp_path / "att.json", fmt=fmt, meta=meta)  # trusted, for these very bytes
    r = _cli("intake", src, "--out", tmp_path / "out", "--attestation", att, "--trust", signer.trust_file, "--json")
    assert r.returncode == ExitCode.INPUT_REJECTED, r.stdout + r.stderr
    assert json.loads(r.stdout)["error"]["code"] == "input.refused_by_policy"
    assert "payload ran" not in r.stdout + r.stderr
    assert not marker.exists()
    assert not (tmp_path / "out").exists()
