"""The policy tools ``ckptgate check`` runs (:mod:`ckptgate.evidence.check_tools`): how ``opa test`` is run
on a judged policy tree."""

from __future__ import annotations

from pathlib import Path

from ckptgate.evidence import check_tools

ZONE_TEST = """package zone_test

test_local_is_utc if {
	opa.runtime().env.TZ == "UTC"
	not opa.runtime().env.ZONEINFO
	time.clock([0, "Local"]) == [0, 0, 0]
}
"""


def test_opa_test_reads_local_time_as_utc_as_the_engine_does(tmp_path: Path) -> None:
    """A judged test's ``"Local"`` zone was the host's (``/etc/localtime``): it is UTC, as in the engine."""
    tree = tmp_path / "pol"
    tree.mkdir()
    (tree / "zone_test.rego").write_text(ZONE_TEST)
    result = check_tools.policy_tests(tree, tmp_path)
    assert result.passed, result.findings


LOOP_TEST = """package loop_test

xs := [i | some i in numbers.range(1, 2000)]

test_fast if {
	count(xs) == 2000
}

test_loops if {
	count([1 | some a in xs; some b in xs; some c in xs]) > 0
}
"""


def test_a_looping_policy_test_is_stopped_at_the_per_test_limit_and_named(tmp_path: Path, monkeypatch) -> None:
    """A judged tree's test that loops (8e9 iterations here) is stopped at :data:`POLICY_TEST_TIMEOUT_S` and
    reported by name as a timeout, at its file and line; the other tests still pass."""
    import time

    monkeypatch.setattr(check_tools, "POLICY_TEST_TIMEOUT_S", 1)
    tree = tmp_path / "pol"
    tree.mkdir()
    (tree / "loop_test.rego").write_text(LOOP_TEST)
    started = time.monotonic()
    result = check_tools.policy_tests(tree, tmp_path)
    took = time.monotonic() - started
    assert not result.passed
    [finding] = result.findings
    assert finding.code == "check.policy_tests.timeout"
    assert "loop_test.test_loops" in finding.message and "1 s" in finding.message
    assert (finding.file, finding.line) == ("pol/loop_test.rego", 9)
    assert took < 15
