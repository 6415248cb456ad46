"""The producer side: a training job attests what it wrote (``ckptgate attest checkpoint``, the hooks)."""

from ckptgate.producer.attest import Attested, AttestRequest, attest_checkpoint

__all__ = ["AttestRequest", "Attested", "attest_checkpoint"]
