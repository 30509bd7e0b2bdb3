"""Names of the QNN-safety passes, kept apart from the passes so options stay import-light."""

from __future__ import annotations

__all__ = ["DEFAULT_PASSES"]

# The default pipeline, in run order (see the _passes package for each pass and the defect it avoids).
DEFAULT_PASSES: tuple[str, ...] = (
    "gathernd_to_gather",
    "fold_gather_scale",
    "gather_runtime_indices_as_rows",
    "unsqueeze_int64_to_reshape",
    "fuse_erf_gelu",
    "fold_high_rank_transpose",
    "drop_empty_concat_inputs",
    "avgpool_count_include_pad",
    "safe_softmax_without_inf",
    "logsoftmax_unit_axis",
    "fuse_softplus",
    "softplus_stable",
    "logsigmoid_to_softplus",
    "fuse_rmsnorm",
    "rmsnorm_weight_last",
    "tile_layernorm_broadcast",
    "int64_to_int32",
)
