"""Export options."""

from __future__ import annotations

import attrs

from qnnx_export import _pass_names
from qnnx_export.errors import InvalidOptionsError

__all__ = [
    "DEFAULT_MAX_DENSE_EXPERTS",
    "DEFAULT_MAX_GATHERED_EXPERT_BYTES",
    "DEFAULT_OPSET",
    "EXPORTERS",
    "MAX_OPSET",
    "MIN_OPSET",
    "ExportOptions",
]

# Opset 20 is the lowest that writes GELU as a single ``Gelu`` node (QNN rejects a bare Erf), and it
# stays below opset 21, whose GroupNormalization form fails QNN session creation (onnxruntime-qnn 2.7.0).
DEFAULT_OPSET = 20
MIN_OPSET = 20
MAX_OPSET = 23
_TWO_GIB = 2 * 1024**3
# Above this many experts a grouped expert product is not computed densely (docs/benchmarks.md, "Mixture of experts").
DEFAULT_MAX_DENSE_EXPERTS = 32
# The most bytes of expert weights one grouped product gathers for its rows (one copy of an expert's weights per
# row): a decode step of Qwen3-30B-A3B (8 rows of 2048 x 1536) gathers 100 MB in float32, GPT-OSS-20B's (4 rows of
# 2880 x 5760) 265 MB; a 128-token prefill of the former would gather 12.9 GB.
DEFAULT_MAX_GATHERED_EXPERT_BYTES = 512 << 20


def _check_opset(_inst: object, _attr: attrs.Attribute, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_OPSET <= value <= MAX_OPSET:
        raise InvalidOptionsError(
            f"ExportOptions.opset={value!r} is not accepted; use an int in [{MIN_OPSET}, {MAX_OPSET}] "
            f"(default {DEFAULT_OPSET}, which is the one tested on QNN HTP)."
        )


def _check_passes(_inst: object, _attr: attrs.Attribute, value: tuple[str, ...] | None) -> None:
    if value is None:
        return
    bad = [p for p in value if not isinstance(p, str) or p not in _pass_names.DEFAULT_PASSES]
    dupes = sorted({p for p in value if isinstance(p, str) and value.count(p) > 1})
    if bad or dupes:
        parts = []
        if bad:
            parts.append(f"unknown pass name(s) {bad!r}")
        if dupes:
            parts.append(f"duplicated pass name(s) {dupes!r}")
        raise InvalidOptionsError(
            f"ExportOptions.passes has {' and '.join(parts)}; accepted names are "
            f"{sorted(_pass_names.DEFAULT_PASSES)!r}. Use None for the default pipeline or () for no passes."
        )


def _check_threshold(_inst: object, _attr: attrs.Attribute, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidOptionsError(
            f"ExportOptions.external_data_threshold={value!r} is not accepted; use an int >= 0 "
            f"(bytes of initializer data above which weights are stored as external data; default 2 GiB)."
        )


EXPORTERS = ("auto", "fast", "torch.onnx")


def _check_max_dense_experts(_inst: object, _attr: attrs.Attribute, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOptionsError(
            f"ExportOptions.max_dense_experts={value!r} is not accepted; use an int >= 1 (the most experts whose "
            f"grouped product is computed densely; default {DEFAULT_MAX_DENSE_EXPERTS})."
        )


def _check_max_gathered_expert_bytes(_inst: object, _attr: attrs.Attribute, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidOptionsError(
            f"ExportOptions.max_gathered_expert_bytes={value!r} is not accepted; use an int >= 0 (the most bytes of "
            "expert weights one grouped product gathers for its rows, 0 for never; default "
            f"{DEFAULT_MAX_GATHERED_EXPERT_BYTES})."
        )


def _check_exporter(_inst: object, _attr: attrs.Attribute, value: str) -> None:
    if value not in EXPORTERS:
        raise InvalidOptionsError(
            f"ExportOptions.exporter={value!r} is not accepted; use one of {list(EXPORTERS)}: 'auto' (the default) "
            "translates the graph directly when every op has a translation and uses torch.onnx otherwise; 'fast' "
            "refuses graphs the direct translator cannot take; 'torch.onnx' always uses torch.onnx.export."
        )


def _to_passes(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        raise InvalidOptionsError(
            f"ExportOptions.passes={value!r} is a string; pass a tuple of pass names, e.g. ({value!r},)."
        )
    try:
        return tuple(value)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidOptionsError(
            f"ExportOptions.passes={value!r} is not a sequence of pass names; use a tuple of names or None."
        ) from None


@attrs.frozen(kw_only=True)
class ExportOptions:
    """How :func:`qnnx_export.export` turns a Dynamo graph into ONNX.

    Attributes:
        opset: ONNX opset of the default domain, in [20, 23]. Default 20.
        passes: Names of the ONNX rewrite passes to run, in order; ``None`` runs the default
            pipeline (every pass, see :meth:`resolved_passes`), ``()`` runs none.
        external_data_threshold: When the initializers hold more than this many bytes the model
            is kept with external data (see :meth:`ExportedGraph.save`). Default 2 GiB, the
            protobuf limit.
        exporter: ``"auto"`` (default): the direct ATen->ONNX translator when it covers every op of
            the graph, else torch.onnx; ``"fast"``: the translator or an error; ``"torch.onnx"``:
            always ``torch.onnx.export`` (dynamo=True).
        lift_mutations: Export a graph whose only problems are in-place writes to inputs or buffers, with the
            analysis from :func:`qnnx_export.lift_mutations`: the new values become extra outputs
            (:attr:`GraphSignature.writebacks`). Only the direct translator captures writes, so such a graph is
            never handed to torch.onnx (it would drop them): the export fails instead.
        max_dense_experts: A mixture-of-experts layer's grouped expert product (transformers' default
            ``grouped_mm`` experts) may be computed densely, every row by every expert, when it has at most this
            many experts. Default 32.
        max_gathered_expert_bytes: Such a product may instead be computed by gathering each row's expert weights (one expert product per row) when
            those gathered weights take at most this many bytes. Gathered is chosen when the product has fewer rows
            than experts (a decode step), dense otherwise; a product over both limits fails the export, naming
            both. Default 512 MiB.
    """

    opset: int = attrs.field(default=DEFAULT_OPSET, validator=_check_opset)
    passes: tuple[str, ...] | None = attrs.field(default=None, converter=_to_passes, validator=_check_passes)
    external_data_threshold: int = attrs.field(default=_TWO_GIB, validator=_check_threshold)
    exporter: str = attrs.field(default="auto", validator=_check_exporter)
    lift_mutations: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    max_dense_experts: int = attrs.field(default=DEFAULT_MAX_DENSE_EXPERTS, validator=_check_max_dense_experts)
    max_gathered_expert_bytes: int = attrs.field(
        default=DEFAULT_MAX_GATHERED_EXPERT_BYTES, validator=_check_max_gathered_expert_bytes
    )

    def resolved_passes(self) -> tuple[str, ...]:
        """Return the pass names that will run (the default pipeline when ``passes`` is None)."""
        if self.passes is None:
            return _pass_names.DEFAULT_PASSES
        return self.passes
