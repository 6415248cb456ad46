"""Strict, per-context allowlists of pickle globals (never a denylist).

A context names what a file is expected to hold.  ``callables`` may be the target of REDUCE,
NEWOBJ, OBJ or INST; ``values`` may only be referenced (dtypes, layouts).  The lists follow
what the pinned producers write (format-notes.md); anything else is a finding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ckptgate.dtypes import STORAGE_DTYPES as _STORAGE_DTYPES
from ckptgate.dtypes import TORCH_ITEMSIZE

__all__ = ["ALLOWLISTS", "DTYPE_ITEMSIZE", "MEGATRON_ARGS_CLASSES", "STORAGE_DTYPES", "Allowlist"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Allowlist:
    name: str
    callables: frozenset[str]
    values: frozenset[str]
    dict_like: frozenset[str]  # call results that SETITEM(S) may fill
    list_like: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.dict_like <= self.callables or not self.list_like <= self.callables:
            raise ValueError("dict_like/list_like must be callables")


# torch dtype name -> itemsize in bytes, and legacy typed-storage class -> dtype (:mod:`ckptgate.dtypes`)
DTYPE_ITEMSIZE: Mapping[str, int] = TORCH_ITEMSIZE
STORAGE_DTYPES: Mapping[str, str] = _STORAGE_DTYPES

_DTYPES = frozenset(f"torch.{d}" for d in DTYPE_ITEMSIZE)

_TENSOR_CALLABLES = frozenset(
    {
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_tensor_v3",
        "torch._utils._rebuild_parameter",
        "torch._tensor._rebuild_from_type_v2",
        "collections.OrderedDict",
        "torch.Size",
    }
)
_TENSOR_VALUES = frozenset(STORAGE_DTYPES) | _DTYPES | frozenset({"torch.Tensor", "torch.nn.parameter.Parameter"})

TENSORS = Allowlist(
    name="tensors", callables=_TENSOR_CALLABLES, values=_TENSOR_VALUES, dict_like=frozenset({"collections.OrderedDict"})
)

_DCP = "torch.distributed.checkpoint.metadata"
DCP_METADATA = Allowlist(
    name="dcp_metadata",
    callables=frozenset(
        {
            "pathlib.PosixPath",
            "torch.Size",
            "torch.serialization._get_layout",
            "torch.distributed.checkpoint.filesystem._StorageInfo",
            f"{_DCP}.Metadata",
            f"{_DCP}.MetadataIndex",
            f"{_DCP}.StorageMeta",
            f"{_DCP}.TensorStorageMetadata",
            f"{_DCP}.ChunkStorageMetadata",
            f"{_DCP}.TensorProperties",
            f"{_DCP}.BytesStorageMetadata",
            f"{_DCP}._MEM_FORMAT_ENCODING",
            "torch.distributed._shard.sharded_tensor.metadata.TensorProperties",
            "collections.OrderedDict",
        }
    ),
    values=_DTYPES,
    dict_like=frozenset({"collections.OrderedDict"}),
)

_PLANNER = "torch.distributed.checkpoint.planner."
_MCORE_TORCH = "megatron.core.dist_checkpointing.strategies.torch."
# Megatron Core caches every rank's SavePlan in Metadata.all_local_plans (plain DCP dataclasses).
# megatron-core 0.15 pickles its own subclasses instead, MCoreMetadata(Metadata) and
# MCoreSavePlan(SavePlan), each with one more field, ``mcore_data`` (strategies/torch.py at
# core_v0.15.3, lines 461-474); 0.16 and later write the torch classes.  dcp.py reads them.
MEGATRON_DCP_METADATA = Allowlist(
    name="megatron_dcp_metadata",
    callables=DCP_METADATA.callables
    | frozenset(_PLANNER + c for c in ("SavePlan", "WriteItem", "WriteItemType", "TensorWriteData"))
    | frozenset(_MCORE_TORCH + c for c in ("MCoreMetadata", "MCoreSavePlan")),
    values=DCP_METADATA.values,
    dict_like=DCP_METADATA.dict_like,
)

DEEPSPEED = Allowlist(
    name="deepspeed",
    callables=_TENSOR_CALLABLES
    | frozenset(
        {
            "deepspeed.runtime.fp16.loss_scaler.LossScaler",
            "deepspeed.runtime.zero.config.ZeroStageEnum",
            "deepspeed.utils.tensor_fragment.fragment_address",
            "copyreg._reconstructor",
            "builtins.set",
            "__builtin__.set",
        }
    ),
    values=_TENSOR_VALUES | frozenset({"builtins.object", "__builtin__.object"}),
    dict_like=frozenset({"collections.OrderedDict"}),
)

_TA = "transformers.training_args."
_TU = "transformers.trainer_utils."
# Resume state a Hugging Face ``Trainer`` checkpoint-N and an Accelerate ``save_state`` folder hold
# beside the model [R19, R20]: ``training_args.bin`` (the TrainingArguments dataclass with its enums
# and the Accelerate state it caches), ``rng_state*.pth`` and ``random_states_*.pkl`` (python,
# numpy and torch RNG states), ``optimizer.pt``/``scheduler.pt``/``scaler.pt`` (state dicts).
# Derived from what transformers 5.24 and accelerate 1.15 write with the pinned torch and numpy
# (a real Trainer run, inventoried with pickletools), plus the enums TrainingArguments can hold.
# Reading these is inspection only: they are never loaded, planned or published.
RESUME_STATE = Allowlist(
    name="resume_state",
    callables=_TENSOR_CALLABLES
    | frozenset(
        {
            _TA + "TrainingArguments",
            "transformers.training_args_seq2seq.Seq2SeqTrainingArguments",
            _TA + "OptimizerNames",
            _TA + "ParallelMode",
            _TU + "IntervalStrategy",
            _TU + "SaveStrategy",
            _TU + "HubStrategy",
            _TU + "SchedulerType",
            _TU + "FSDPOption",
            "transformers.debug_utils.DebugOption",
            "transformers.trainer_pt_utils.AcceleratorConfig",
            "accelerate.state.PartialState",
            "accelerate.utils.dataclasses.DistributedType",
            # TrainingArguments(deepspeed=...) also holds the DeepSpeed config objects (a real run,
            # tests/fixtures/data/trainer_deepspeed_zero2)
            "transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig",
            "transformers.integrations.deepspeed.HfDeepSpeedConfig",
            "accelerate.utils.dataclasses.DeepSpeedPlugin",
            "torch.device",
            "numpy._core.multiarray._reconstruct",
            "numpy.core.multiarray._reconstruct",
            "numpy.ndarray",
            "numpy.dtype",
            "_codecs.encode",
        }
    ),
    values=_TENSOR_VALUES,
    dict_like=frozenset({"collections.OrderedDict"}),
)

_MCORE_ENUMS = "megatron.core.transformer.enums."
# The common state of a Megatron-LM save (``common.pt`` up to megatron-core 0.16.x, the BYTE_IO item
# ``common_state/shard_0_1`` of the ``.distcp`` files from 0.19): megatron/training/checkpointing.py
# ``generate_state_dict`` puts ``args`` there, the ``argparse.Namespace`` that arguments.py builds.
# Its non-plain values, found by pickling a real ``parse_args()`` + ``validate_args()`` of Megatron-LM
# core_v0.16.1 and read from the sources of core_v0.16.1 and core_v0.19.0: ``attention_backend``
# (``AttnBackend[...]``), ``exit_signal`` (``signal.SIGTERM``), the ``*_dtype`` arguments (torch
# dtypes), ``model_type`` (training.py sets a ``ModelType``), ``cuda_graph_scope`` (0.16:
# ``CudaGraphScope[...]``), ``cuda_graph_modules`` and ``inference_cuda_graph_scope`` (0.19).  An
# enum is pickled as a call of its class on its value, a Namespace as NEWOBJ + BUILD of its dict:
# read statically, neither is ever constructed.  Nothing else (no ``PipelineParallelLayerLayout``,
# no activation function): anything outside is a finding.
MEGATRON_ARGS_CLASSES = frozenset(
    {
        "argparse.Namespace",
        "signal.Signals",
        "megatron.core.enums.ModelType",
        _MCORE_ENUMS + "AttnBackend",
        _MCORE_ENUMS + "CudaGraphScope",
        _MCORE_ENUMS + "CudaGraphModule",
        _MCORE_ENUMS + "InferenceCudaGraphScope",
    }
)
MEGATRON_COMMON = Allowlist(
    name="megatron_common",
    callables=_TENSOR_CALLABLES | MEGATRON_ARGS_CLASSES,
    values=_TENSOR_VALUES,
    dict_like=frozenset({"collections.OrderedDict"}),
)

ALLOWLISTS: dict[str, Allowlist] = {
    a.name: a for a in (TENSORS, DCP_METADATA, MEGATRON_DCP_METADATA, MEGATRON_COMMON, DEEPSPEED, RESUME_STATE)
}
