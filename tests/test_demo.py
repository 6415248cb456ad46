"""``ckptgate demo`` on a core install (no torch): a typed usage error that names the extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ckptgate.errors import ExitCode

# torch (and huggingface_hub) made unimportable, as on a core install without the [torch] extra.
_WITHOUT_TORCH = """
import sys
class _Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "huggingface_hub"):
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, _Hide())
import importlib.util
_find = importlib.util.find_spec
_HIDDEN = ("torch", "huggingface_hub")
importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] in _HIDDEN else _find(name, *a)
sys.argv = ["ckptgate", *sys.argv[1:]]
from ckptgate._cli import main
main()
"""


def test_demo_without_torch_is_a_typed_error_naming_the_extra(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTGATE_")}
    work = tmp_path / "demo"
    out = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, "demo", "--workdir", str(work), "--json"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == ExitCode.USAGE, out.stdout + out.stderr
    err = json.loads(out.stdout)["error"]
    assert err["code"] == "usage.demo_needs_torch"
    assert "pip install 'ckptgate[torch]'" in err["advice"]
    assert set(err["evidence"]["missing"]) == {"torch", "huggingface_hub"}
    assert "Traceback" not in out.stderr and not work.exists()  # stopped before touching anything
