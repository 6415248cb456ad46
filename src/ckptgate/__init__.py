"""ckptgate: a policy-as-code gate for distributed-training checkpoints.

Data flows one way through one home per step::

    inspect  ->  digest  ->  verify  ->  decide  ->  enforce  ->  consolidate  ->  publish

* :mod:`ckptgate.inspect`     reads a checkpoint by its content, never executing it.
* :mod:`ckptgate.digest`      computes the fixture digest over a canonical manifest.
* :mod:`ckptgate.verify`      checks DSSE and Sigstore attestations (Python does the cryptography).
* :mod:`ckptgate.decide`      builds the OPA input document and evaluates the Rego policies.
* :mod:`ckptgate.enforce`     turns an allow decision into a permit and runs contained loaders.
* :mod:`ckptgate.consolidate` plans and writes Hugging Face sharded safetensors.
* :mod:`ckptgate.publish`     publishes atomically and writes the receipt.

:mod:`ckptgate.pipeline` composes them; the CLI in :mod:`ckptgate._cli` is a thin private layer.
"""

__version__ = "0.1.0"
