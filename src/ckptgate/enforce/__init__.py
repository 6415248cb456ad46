"""Enforce: the step between decide and consolidate that gates every loader and the publication.

:func:`ckptgate.enforce.gate.enforce` checks the decision once (allow, and every loader the
checkpoint needs permitted), mints a :class:`~ckptgate.enforce.permit.Permit` bound to the exact
bytes when files need a framework load, and runs that load only inside the contained worker
(:mod:`ckptgate.enforce.load`, :mod:`ckptgate.enforce.worker`).  Containment is a set of
controls that narrow what a malicious loader can reach; it is never a proof that a load is safe
[R28, R30-R35].
"""
