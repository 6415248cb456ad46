"""Evidence to claims: qualification runs, the generated support matrix, the pre-merge gate and
reviewer reports.

* :mod:`~ckptgate.evidence.candidate` -- the candidate commit that evidence is bound to.
* :mod:`~ckptgate.evidence.qualify` -- run an adapter on a real fixture, compare bit for bit, sign.
* :mod:`~ckptgate.evidence.matrix` -- verify stored attestations, ask ``ckptgate.support``, render ``matrix/``.
* :mod:`~ckptgate.evidence.claims` -- extract doc sentences and citations for ``ckptgate.claims``.
* :mod:`~ckptgate.evidence.check` -- the pre-merge gate (policy tests, fmt, lint, drift, evidence, claims).
* :mod:`~ckptgate.evidence.report` -- the reviewer report for one checkpoint.
"""

from ckptgate.evidence.errors import CheckFailed, EvidenceError, GitError, QualificationFailed

__all__ = ["CheckFailed", "EvidenceError", "GitError", "QualificationFailed"]
