"""ckptgate: a policy-as-code gate for distributed-training checkpoints.

Data flows one way through one home per step::

    inspect  ->  digest  ->  verify  ->  decide  ->  enforce  ->  consolidate  ->  publish

* :mod:`ckptgate.inspect`     reads a checkpoint by its content, never executing it.
* :mod:`ckptgate.digest`      computes the fixture digest over a canonical manifest (a ``Digest`` value).
* :mod:`ckptgate.verify`      checks DSSE and Sigstore attestations and OpenSSF Model Signing bundles.
* :mod:`ckptgate.decide`      reaches the policy engine with its trust data, builds the OPA input
  document and evaluates the Rego policies.
* :mod:`ckptgate.enforce`     turns an allow decision into a permit and runs contained loaders.
* :mod:`ckptgate.consolidate` plans and writes Hugging Face sharded safetensors.
* :mod:`ckptgate.publish`     publishes atomically, the receipt last.

:mod:`ckptgate.pipeline` composes them and builds the receipt; ``ckptgate.evidence`` and
``ckptgate.demo`` use them; ``ckptgate.receipt`` checks a published output later.  The CLI in
:mod:`ckptgate._cli` is a thin private layer.
"""

__version__ = "0.1.0"
