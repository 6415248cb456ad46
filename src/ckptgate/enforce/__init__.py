"""Enforce: permits minted from allow decisions, containment preflight, and the contained worker.

No loader that is not pure data runs without a :class:`~ckptgate.enforce.permit.Permit` bound to
the exact bytes, and then only inside the contained worker (:mod:`ckptgate.enforce.worker`).
Containment is a set of controls that narrow what a malicious loader can reach; it is never a
proof that a load is safe [R28, R30–R35].
"""
