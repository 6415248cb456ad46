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
