"""The policy's pickle allowlist covers every global the static reader can interpret.

The static reader (``ckptgate.inspect.allowlist``) knows how to interpret each global without
running it; the policy decides which of them are acceptable.  A global the reader accepts but the
policy data does not name would make every such checkpoint a ``pickle_global_not_allowlisted``
deny, so the two must move together.
"""

from __future__ import annotations

import json
from pathlib import Path

from ckptgate.inspect.allowlist import ALLOWLISTS

DATA = Path(__file__).resolve().parents[2] / "policies" / "ckptgate" / "config" / "loaders" / "data.json"


def test_policy_allowlist_covers_the_static_readers_allowlists():
    policy = set(json.loads(DATA.read_text())["pickle_allowlist"])
    lists = [a for name, a in ALLOWLISTS.items() if name != "resume_state"]
    reader = set().union(*(set(a.callables) | set(a.values) for a in lists))
    assert sorted(reader - policy) == []


def test_resume_state_allowlist_is_the_same_in_reader_and_policy():
    """Resume state is held to its own list (it is never loaded), in both places alike, and no
    resume-state-only global (numpy, the Trainer's classes) widens what a model pickle may name."""
    data = json.loads(DATA.read_text())
    reader = ALLOWLISTS["resume_state"]
    assert sorted(data["resume_state_allowlist"]) == sorted(reader.callables | reader.values)
    assert "transformers.training_args.TrainingArguments" in data["resume_state_allowlist"]
    assert not {"_codecs.encode", "numpy.ndarray", "transformers.training_args.TrainingArguments",
                "accelerate.state.PartialState"} & set(data["pickle_allowlist"])
