"""Companions carry no code references (issue 30): every way a JSON file of the checkpoint can
name code for transformers' dynamic-module loader is refused, end to end, and the table of the
loader's callers in ``ckptgate.inspect.coderefs`` is checked against the installed transformers."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from ckptgate.errors import ExitCode
from ckptgate.inspect.coderefs import CALL_SITES, CODE_KEYS, code_reference_findings

REPO = Path(__file__).resolve().parents[2]
HF = REPO / "tests" / "fixtures" / "data" / "hf_sharded" / "checkpoint"
LOADERS = frozenset({"get_class_from_dynamic_module", "get_cached_module_file"})


# -- the table of call sites against the installed transformers source ----------------------------
def _transformers_root() -> Path:
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        pytest.fail("transformers is not installed in the project's environment (a peft dependency)")
    return Path(spec.origin).parent


class _Refs(ast.NodeVisitor):
    """Every reference to a loader in one module: calls, names, attributes and string constants
    (a ``getattr(module, "get_class_from_dynamic_module")`` counts), with the enclosing function."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.aliases: dict[str, str] = {}
        self.found: set[tuple[str, str]] = set()

    def _scope(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scope

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:  # an import is not a use; its alias is
        for a in node.names:
            if a.name in LOADERS and a.asname:
                self.aliases[a.asname] = a.name

    def _hit(self, name: str) -> None:
        name = self.aliases.get(name, name)
        if name in LOADERS:
            self.found.add((".".join(self.stack) or "<module>", name))

    def visit_Name(self, node: ast.Name) -> None:
        self._hit(node.id)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._hit(node.attr)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            self._hit(node.value)


def _callers(root: Path) -> set[tuple[str, str, str]]:
    out: set[tuple[str, str, str]] = set()
    for p in sorted(root.rglob("*.py")):
        raw = p.read_bytes()
        if not any(n.encode() in raw for n in LOADERS):
            continue
        v = _Refs()
        v.visit(ast.parse(raw))
        rel = p.relative_to(root).as_posix()
        out |= {(rel, fn, loader) for fn, loader in v.found}
    return out


def test_the_installed_transformers_is_the_pinned_reference() -> None:
    pins = tomllib.loads((REPO / "pins.toml").read_text())
    assert importlib.metadata.version("transformers") == pins["reference"]["transformers"]


def test_every_caller_of_the_dynamic_module_loader_is_in_the_table() -> None:
    """A new entry point in a future transformers pin fails here until the table accounts for it
    (and says which companion key carries its reference); a row whose caller is gone fails too."""
    found = _callers(_transformers_root())
    table = {(s.path, s.function, s.loader) for s in CALL_SITES}
    # the module-level definitions themselves are not callers
    found -= {("dynamic_module_utils.py", "<module>", n) for n in LOADERS}
    found -= {("dynamic_module_utils.py", n, n) for n in LOADERS if (("dynamic_module_utils.py", n, n) not in table)}
    assert found - table == set(), f"callers the table does not account for: {sorted(found - table)}"
    assert table - found == set(), f"rows whose caller is gone: {sorted(table - found)}"
    assert len(found) >= 10  # the scan reads the package (9 public entry points in 5.24)


def test_the_scan_finds_a_new_caller_under_an_alias(tmp_path: Path) -> None:
    pkg = tmp_path / "transformers"
    (pkg / "models").mkdir(parents=True)
    (pkg / "models" / "new_auto.py").write_text(
        "from ..dynamic_module_utils import get_class_from_dynamic_module as load\n"
        "class AutoThing:\n    def from_pretrained(cls, ref):\n        return load(ref, 'x')\n"
        "def hidden(m):\n    return getattr(m, 'get_cached_module_file')\n"
    )
    assert _callers(pkg) == {
        ("models/new_auto.py", "AutoThing.from_pretrained", "get_class_from_dynamic_module"),
        ("models/new_auto.py", "hidden", "get_cached_module_file"),
    }


# -- the scan of one document -------------------------------------------------------------------
SPELLINGS: list[tuple[str, str, Any]] = [
    ("auto_map top level", "config.auto_map", {"auto_map": {"AutoModel": "modeling_x.Model"}}),
    ("auto_map in text_config", "config.auto_map", {"text_config": {"auto_map": {"AutoModel": "m.C"}}}),
    (
        "auto_map deep",
        "config.auto_map",
        {"a": [{"b": {"vision_config": {"sub": {"auto_map": {"AutoConfig": "cfg.Cfg"}}}}}]},
    ),
    ("auto_map list (tokenizer)", "config.auto_map", {"auto_map": {"AutoTokenizer": ["tok.Slow", None]}}),
    ("auto_map legacy list", "config.auto_map", {"auto_map": ["tok.Slow", "tok.Fast"]}),
    ("custom_pipelines", "config.custom_pipelines", {"custom_pipelines": {"t": {"impl": "pipe.P", "pt": []}}}),
    ("custom_pipelines nested", "config.custom_pipelines", {"x": {"custom_pipelines": {"t": {"impl": "p.P"}}}}),
    ("repo--module.Class value", "config.dynamic_module_ref", {"whatever": "evil/repo--modeling_x.Model"}),
    ("repo--module.Class in a list", "config.dynamic_module_ref", {"architectures": ["o/r--sub/m.C"]}),
]


@pytest.mark.parametrize(("what", "code", "doc"), SPELLINGS, ids=[s[0] for s in SPELLINGS])
def test_each_spelling_is_a_code_bearing_error(what: str, code: str, doc: Any) -> None:
    found = code_reference_findings("config.json", doc)
    assert [f.code for f in found] == [code], found
    assert found[0].severity == "error" and found[0].evidence["pointer"]


@pytest.mark.parametrize(
    "doc",
    [
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16"},
        {"auto_map": None, "auto_mapping": None, "custom_pipelines": {}},  # names no code
        {"_name_or_path": "/root/.cache/huggingface/hub/models--org--name/snapshots/abc.1"},  # two "--"
        {"model": {"vocab": {"auto_map": 5, "a--b.c.d": 6}, "merges": ["a--b .C"]}},  # tokens, not references
        {"chat_template": "{{ a--b.C }} and more"},
    ],
)
def test_what_names_no_code_is_not_a_finding(doc: Any) -> None:
    assert code_reference_findings("tokenizer.json", doc) == []


def test_a_reference_inside_a_flagged_key_is_reported_once() -> None:
    found = code_reference_findings("config.json", {"auto_map": {"AutoModel": "o/r--m.C"}})
    assert [f.code for f in found] == ["config.auto_map"]


def test_the_table_names_the_keys_the_scan_refuses() -> None:
    assert set(CODE_KEYS) == {k for s in CALL_SITES for k in s.keys} == {"auto_map", "custom_pipelines"}


# -- end to end: the CLI refuses each spelling in every companion, and a clean config passes -------
def _cli(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptgate", *map(str, args), "--json"], capture_output=True,
                          text=True, timeout=180, cwd=cwd, env=dict(os.environ))


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from ckptgate.verify import QUALIFICATION_PREDICATE_TYPE, generate_keypair, trust_entry

    d = tmp_path_factory.mktemp("signer")
    priv, pub = generate_keypair("ed25519")
    (d / "key.pem").write_bytes(priv)
    entry = trust_entry(pub, signer_id="test-key", predicate_types=[QUALIFICATION_PREDICATE_TYPE])
    (d / "trust.json").write_text(json.dumps({"signers": [entry]}))
    return {"key": d / "key.pem", "trust": d / "trust.json"}


def _intake(tmp: Path, signer: dict[str, Path], files: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    from ckptgate.demo import demo_statement
    from ckptgate.digest import fixture_digest
    from ckptgate.inspect import SafeTree
    from ckptgate.verify import KeySigner
    from ckptgate.verify.dsse import sign_statement

    src = tmp / "ckpt"
    shutil.copytree(HF, src)
    for name, doc in files.items():
        (src / name).parent.mkdir(exist_ok=True)
        (src / name).write_text(json.dumps(doc))
    with SafeTree.open(src) as tree:
        digest = fixture_digest(tree).digest
    att = tmp / "att.json"
    statement = demo_statement(digest, "hf_sharded", producer=("huggingface_hub", "2.4.0"))
    att.write_bytes(sign_statement(statement, KeySigner.from_pem(signer["key"])))
    return _cli("intake", src, "--out", tmp / "out", "--attestation", att, "--trust", signer["trust"], cwd=tmp)


CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4}
E2E = [
    ("config.json", {**CONFIG, "auto_map": {"AutoModelForCausalLM": "modeling_evil.Evil"}}, "config.auto_map"),
    ("config.json", {**CONFIG, "text_config": {"vision_config": {"auto_map": {"AutoConfig": "c.C"}}}},
     "config.auto_map"),
    ("config.json", {**CONFIG, "custom_pipelines": {"evil": {"impl": "pipe.Evil", "pt": ["AutoModel"]}}},
     "config.custom_pipelines"),
    ("config.json", {**CONFIG, "note": "attacker/repo--modeling_evil.Evil"}, "config.dynamic_module_ref"),
    ("generation_config.json", {"bos_token_id": 1, "auto_map": {"AutoConfig": "c.C"}}, "config.auto_map"),
    ("tokenizer_config.json", {"auto_map": {"AutoTokenizer": ["tok.Slow", "tok.Fast"]}}, "config.auto_map"),
    ("tokenizer.json", {"version": "1.0", "post_processor": {"ref": "a/b--tok.T"}}, "config.dynamic_module_ref"),
    ("special_tokens_map.json", {"bos_token": "<s>", "extra": {"auto_map": "m.C"}}, "config.auto_map"),
    ("preprocessor_config.json", {"auto_map": {"AutoImageProcessor": "ip.P"}}, "config.auto_map"),
    ("processor_config.json", {"auto_map": {"AutoProcessor": "p.P"}}, "config.auto_map"),
    ("adapter_config.json", {"peft_type": "LORA", "auto_map": {"AutoModel": "m.M"}}, "config.auto_map"),
    ("sub/anything.json", {"deep": [{"custom_pipelines": {"t": {"impl": "x.Y"}}}]}, "config.custom_pipelines"),
]


@pytest.mark.parametrize(("name", "doc", "code"), E2E, ids=[f"{e[0]}:{e[2]}" for e in E2E])
def test_intake_refuses_each_spelling_with_exit_4(tmp_path: Path, signer: dict[str, Path], name: str, doc: Any,
                                                  code: str) -> None:
    res = _intake(tmp_path, signer, {"config.json": CONFIG, name: doc})
    assert "Traceback" not in res.stdout + res.stderr
    assert res.returncode == ExitCode.INPUT_REJECTED, res.stdout + res.stderr
    err = json.loads(res.stdout)["error"]
    assert err["code"] == "input.refused_by_policy", err
    assert {"code": code, "path": name} in [f for r in err["reasons"] for f in r["evidence"].get("findings", [])]
    assert not (tmp_path / "out").exists()


def test_a_clean_config_and_tokenizer_still_pass(tmp_path: Path, signer: dict[str, Path]) -> None:
    res = _intake(tmp_path, signer, {
        "config.json": {**CONFIG, "text_config": {"hidden_size": 4}, "auto_mapping": None},
        "tokenizer_config.json": {"model_max_length": 32, "chat_template": "{{ x--y.Z }}"},
    })
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads((tmp_path / "out" / "config.json").read_text())["text_config"] == {"hidden_size": 4}


# -- review of issue #30: a .json companion whose content sniffs as another kind ------------------
EVIL = {**CONFIG, "auto_map": {"AutoModelForCausalLM": "modeling_evil.Evil"}}
HIDDEN = [
    # transformers' json.loads skips leading white space that the 4 KiB sniffing window does not
    pytest.param(b" " * 5000 + json.dumps(EVIL).encode(), id="whitespace-past-the-sniff"),
    # a ninth byte "{" sniffs as a safetensors header
    pytest.param(b'{"a":   {"b": 1}, ' + json.dumps(EVIL).encode()[1:], id="sniffs-as-safetensors"),
    # the strict reader refuses a duplicate key; transformers takes the last one
    pytest.param(b'{"auto_map": null, ' + json.dumps(EVIL).encode()[1:], id="duplicate-key"),
]


@pytest.mark.parametrize("raw", HIDDEN)
def test_a_code_reference_hidden_from_the_sniffer_is_refused_under_an_exception(
    tmp_path: Path, signer: dict[str, Path], raw: bytes
) -> None:
    """An explicit (trusted) overlay excepts `classify.extension_mismatch` for config.json: the
    auto_map that transformers would read from the same bytes must still refuse the checkpoint."""
    from ckptgate.demo import demo_statement
    from ckptgate.digest import fixture_digest
    from ckptgate.inspect import SafeTree
    from ckptgate.verify import KeySigner
    from ckptgate.verify.dsse import sign_statement

    assert json.loads(raw.decode())["auto_map"]  # what transformers reads
    src = tmp_path / "ckpt"
    shutil.copytree(HF, src)
    (src / "config.json").write_bytes(raw)
    with SafeTree.open(src) as tree:
        digest = fixture_digest(tree).digest
    att = tmp_path / "att.json"
    att.write_bytes(sign_statement(demo_statement(digest, "hf_sharded", producer=("huggingface_hub", "2.4.0")),
                                   KeySigner.from_pem(signer["key"])))
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "data.json").write_text(json.dumps({"finding_exceptions": [{
        "id": "padded-json", "formats": ["hf-sharded-safetensors"], "code": "classify.extension_mismatch",
        "paths": ["config.json"], "why": "an exporter of ours pads its JSON"}]}))
    (conf / "ckptgate.toml").write_text('policy_data = "data.json"\ntrust = "trust.json"\ndocs = []\n')
    shutil.copy(signer["trust"], conf / "trust.json")
    res = _cli("intake", src, "--out", tmp_path / "out", "--attestation", att, "--config", conf / "ckptgate.toml",
               cwd=tmp_path)
    assert res.returncode == ExitCode.INPUT_REJECTED, res.stdout + res.stderr
    reasons = json.loads(res.stdout)["error"]["reasons"]
    assert {"code": "config.auto_map", "path": "config.json"} in [
        f for r in reasons for f in r["evidence"].get("findings", [])
    ], reasons
    assert not (tmp_path / "out").exists()


def test_a_json_file_too_large_to_read_for_code_references_is_refused(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the size cap, a .json file that sniffs as text is not read at all: that must be a
    refusal of its own (json.too_large, not exceptable), not only an exceptable extension mismatch."""
    from ckptgate.inspect import files
    from ckptgate.inspect.inspection import inspect_tree

    monkeypatch.setattr(files, "MAX_JSON", 8192)
    (tmp_path / "config.json").write_bytes(b" " * 9000 + json.dumps(EVIL).encode())
    found = {(f.code, f.path) for f in inspect_tree(tmp_path).findings if f.severity == "error"}
    assert ("json.too_large", "config.json") in found, found
