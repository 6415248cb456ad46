"""Evidence to claims: qualification runs, the generated support matrix, the pre-merge gate and
reviewer reports.

* :mod:`~ckptgate.evidence.candidate` -- the candidate commit that evidence is bound to.
* :mod:`~ckptgate.evidence.qualify` -- run an adapter on a real fixture, compare bit for bit, sign.
* :mod:`~ckptgate.evidence.layout` -- where a repository keeps its store, matrix and fixtures (its configuration).
* :mod:`~ckptgate.evidence.fixtures` -- the fixtures catalogue.
* :mod:`~ckptgate.evidence.gates` -- what the gates data names for a fixture (adapter, producer, validity).
* :mod:`~ckptgate.evidence.environment`, :mod:`~ckptgate.evidence.compare`, :mod:`~ckptgate.evidence.stored` --
  where a qualification ran, the bit-for-bit comparison, and superseding an earlier qualification.
* :mod:`~ckptgate.evidence.provenance` -- CI vouches for a fixture's committed bytes before a framework load.
* :mod:`~ckptgate.evidence.matrix` -- verify stored attestations, ask ``ckptgate.support``, render ``matrix/``.
  Its policy input is :mod:`~ckptgate.evidence.matrix_input`'s, its pages :mod:`~ckptgate.evidence.matrix_render`'s,
  the generated gate :mod:`~ckptgate.evidence.matrix_gate`'s.
* :mod:`~ckptgate.evidence.claims` -- extract doc sentences and citations for ``ckptgate.claims``.
* :mod:`~ckptgate.evidence.check` -- the pre-merge gate (policy tests, fmt, lint, drift, evidence, claims).
* :mod:`~ckptgate.evidence.report` -- the reviewer report for one checkpoint.
"""

from ckptgate.evidence.errors import CheckFailed, EvidenceError, GitError, QualificationFailed

__all__ = ["CheckFailed", "EvidenceError", "GitError", "QualificationFailed"]
