"""Megatron Core ``torch_dist`` into a Hugging Face model, through a declared family table [R04, R07].

* :mod:`.table`: the family table (``families.json``, package data) and the declared config it
  accepts (:class:`~.table.Declared`), refused with a typed reason for anything outside it;
* :mod:`.engine`: the one engine: the table's rules become windows (strided row blocks) over the
  planner's placements (:func:`~ckptgate.consolidate.adapters._common.slice_placements`), and a
  source ledger proves every element of every model tensor is consumed exactly once or is a
  declared drop;
* :mod:`.source`: ``--hf-config``: the config file or directory, read once with a size cap, with
  its manifest (path, size, sha256);
* :mod:`.tokens`: the published tokenizer's token ids index rows of the published embedding.
"""
