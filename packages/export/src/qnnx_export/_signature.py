"""How the Dynamo calling convention maps onto the ONNX model's inputs and outputs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs

from qnnx_export.errors import SignatureError

if TYPE_CHECKING:
    import torch

__all__ = ["COMPLEX_PARTS", "GraphSignature", "InputSpec", "OutputSlot", "RowWriteback"]

# The dtypes a bfloat16 argument may have been exported as (QNN has no bfloat16).
_BFLOAT16_EXPORTED_AS = frozenset({"float32", "float16"})
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

COMPLEX_PARTS = {"complex64": "float32"}
"""Complex dtypes an ``onnx`` output slot may name, and the dtype of the real pair ``[..., 2]`` the ONNX output holds
(the slot's value is ``torch.view_as_complex`` of it)."""


def _dtype(name: str) -> torch.dtype:
    import torch

    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise SignatureError(f"{name!r} is not a torch dtype name; expected e.g. 'float32', 'int64', 'bool'.")
    return dt


def dtype_name(dtype: torch.dtype) -> str:
    """Return the torch dtype's short name (``torch.float32`` -> ``"float32"``)."""
    return str(dtype).removeprefix("torch.")


# The attrs converters of the fields below: ``tuple`` once per element type, which mypy's attrs plugin can type (it
# cannot infer ``converter=tuple``, nor a generic converter).
def _int_tuple(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _input_tuple(value: Iterable[InputSpec]) -> tuple[InputSpec, ...]:
    return tuple(value)


def _output_tuple(value: Iterable[OutputSlot]) -> tuple[OutputSlot, ...]:
    return tuple(value)


def _row_tuple(value: Iterable[RowWriteback]) -> tuple[RowWriteback, ...]:
    return tuple(value)


def _pairs(value: Iterable[Iterable[int]]) -> tuple[tuple[int, int], ...]:
    return tuple((int(a), int(b)) for a, b in value)


@attrs.frozen(kw_only=True)
class InputSpec:
    """One ONNX graph input.

    Attributes:
        name: ONNX input name.
        arg_index: Position of the Dynamo argument that feeds it.
        dtype: torch dtype name of the Dynamo argument.
        onnx_dtype: torch dtype name the ONNX input expects (differs when legalized, e.g. int64 -> int32).
        shape: Static shape.
        max_abs: For an integer input, the largest magnitude up to which the graph's integer arithmetic provably
            stays within int32 (which HTP computes integers in, saturating); None when any int32 value is safe.
            The caller computes a call whose input goes beyond it elsewhere.
        onnx_shape: The shape the ONNX input has when it is a view of the argument of another rank (an integer
            tensor of rank 5 or more is fed with its leading dims merged: HTP holds no such tensor); None when it
            is ``shape``. The caller reshapes the contiguous argument, which copies nothing.
    """

    name: str
    arg_index: int
    dtype: str
    onnx_dtype: str
    shape: tuple[int, ...] = attrs.field(converter=_int_tuple)
    max_abs: int | None = None
    onnx_shape: tuple[int, ...] | None = attrs.field(default=None, converter=attrs.converters.optional(_int_tuple))


@attrs.frozen(kw_only=True)
class OutputSlot:
    """Where one element of the graph's output comes from.

    Attributes:
        kind: ``onnx`` (ONNX output ``index``), ``arg`` (Dynamo argument ``index`` returned as is),
            ``none`` (Python None) or ``constant`` (``value``, a JSON scalar).
        index: ONNX output index or Dynamo argument index.
        dtype: torch dtype name to return for ``onnx`` slots (a cast back when the ONNX output was legalized; a
            complex dtype of ``COMPLEX_PARTS`` when the ONNX output is the real pair of a complex result).
        value: The constant for ``constant`` slots.
        shape: For an ``onnx`` slot, the shape to view the ONNX output as when the model returns it with another
            rank (an integer result of rank 5 or more comes back with its leading dims merged); None when the
            output has the result's shape.
    """

    kind: Literal["onnx", "arg", "none", "constant"]
    index: int = -1
    dtype: str = ""
    value: bool | int | float | str | None = None
    shape: tuple[int, ...] | None = attrs.field(default=None, converter=attrs.converters.optional(_int_tuple))


@attrs.frozen(kw_only=True)
class RowWriteback:
    """Rows the graph wrote into an argument (``arg.index_copy_(dim, index, rows)``, how a KV cache takes tokens).

    After each run the caller writes only those rows, so the write-back costs what the graph wrote, not the size of
    the argument.

    Attributes:
        arg_index: Dynamo argument written.
        dim: Dimension the rows are written along.
        values: ONNX output holding the rows.
        index: ONNX output holding their positions (int), or -1 when ``index_arg`` holds them.
        index_arg: Dynamo argument holding the positions (a ``cache_position`` input), or -1.
    """

    arg_index: int
    dim: int
    values: int
    index: int = -1
    index_arg: int = -1

    def __attrs_post_init__(self) -> None:
        if (self.index < 0) == (self.index_arg < 0):
            raise SignatureError(
                f"RowWriteback(index={self.index}, index_arg={self.index_arg}): exactly one of them must be a "
                "position (>= 0), the other -1."
            )

    def apply(self, target: torch.Tensor, onnx_outputs: Sequence[Any], args: Sequence[Any]) -> None:
        """Write the rows into ``target`` (the caller's tensor), as eager's ``index_copy_`` leaves it."""
        import torch

        positions = torch.as_tensor(args[self.index_arg] if self.index_arg >= 0 else onnx_outputs[self.index])
        rows = torch.as_tensor(onnx_outputs[self.values])  # numpy arrays are shared, not copied
        target.index_copy_(self.dim, positions.reshape(-1).to(torch.int64), rows.to(target.dtype))


@attrs.frozen(kw_only=True)
class GraphSignature:
    """The calling convention between Dynamo's arguments/outputs and the exported ONNX model.

    JSON-serializable: ``GraphSignature.from_dict(sig.to_dict()) == sig``.

    Attributes:
        inputs: One :class:`InputSpec` per ONNX input, in ONNX input order.
        outputs: One :class:`OutputSlot` per element of the graph module's output.
        onnx_output_names: ONNX output names, in ONNX output order.
        onnx_output_dtypes: torch dtype names of the ONNX outputs as the model produces them.
        output_container: ``tuple`` or ``list`` (the container the graph module returns), or ``single``
            when it returns one bare value (hand-made FX graphs; Dynamo always returns a tuple).
    """

    inputs: tuple[InputSpec, ...] = attrs.field(converter=_input_tuple)
    outputs: tuple[OutputSlot, ...] = attrs.field(converter=_output_tuple)
    onnx_output_names: tuple[str, ...] = attrs.field(converter=_str_tuple)
    onnx_output_dtypes: tuple[str, ...] = attrs.field(converter=_str_tuple)
    output_container: Literal["tuple", "list", "single"] = "tuple"
    writebacks: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=_pairs)
    """``(ONNX output index, Dynamo argument index)`` per tensor the graph writes in place: after each run the
    caller copies that output into that argument (it is not part of the graph's returned value)."""
    row_writebacks: tuple[RowWriteback, ...] = attrs.field(default=(), converter=_row_tuple)
    """Arguments the graph writes rows into: after each run the caller writes only those rows (see
    :class:`RowWriteback`)."""

    @property
    def writes(self) -> bool:
        """Whether the graph writes into any of its arguments (the caller must apply the write-backs)."""
        return bool(self.writebacks or self.row_writebacks)

    @property
    def user_indices(self) -> tuple[int, ...]:
        """Dynamo argument positions that feed the ONNX inputs, in ONNX input order."""
        return tuple(s.arg_index for s in self.inputs)

    @property
    def input_names(self) -> tuple[str, ...]:
        """ONNX input names, in ONNX input order."""
        return tuple(s.name for s in self.inputs)

    @property
    def input_dtypes(self) -> tuple[str, ...]:
        """torch dtype names of the Dynamo arguments feeding the ONNX inputs."""
        return tuple(s.dtype for s in self.inputs)

    @property
    def input_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Static shapes of the ONNX inputs."""
        return tuple(s.shape for s in self.inputs)

    @property
    def num_onnx_outputs(self) -> int:
        """Number of ONNX outputs (0 means the graph needs no session: every output is an arg/constant)."""
        return len(self.onnx_output_names)

    def onnx_inputs(self, args: Sequence[Any]) -> list[torch.Tensor]:
        """Select and prepare the ONNX inputs from the full Dynamo argument list.

        Tensors are made contiguous and cast where the ONNX input dtype differs (int64 inputs are
        fed as int32; a value outside the int32 range raises instead of saturating silently). A bfloat16
        tensor is cast to a float32 or float16 input (a bfloat16 graph exported in a dtype QNN has).

        Args:
            args: All Dynamo arguments (parameters included), as the compiled callable receives them.

        Returns:
            Tensors in ONNX input order.

        Raises:
            SignatureError: An argument is missing, has another shape/dtype than exported, or an
                int64 value does not fit in int32.
        """
        import torch

        out: list[torch.Tensor] = []
        errors: list[str] = []
        for spec in self.inputs:
            if spec.arg_index >= len(args):
                errors.append(f"argument {spec.arg_index} ({spec.name}) is missing: got {len(args)} args")
                continue
            t = args[spec.arg_index]
            if not isinstance(t, torch.Tensor):
                errors.append(f"argument {spec.arg_index} ({spec.name}) is a {type(t).__name__}, not a tensor")
                continue
            if t.dtype == torch.bfloat16 and spec.dtype in _BFLOAT16_EXPORTED_AS and tuple(t.shape) == spec.shape:
                t = t.to(_dtype(spec.dtype))  # a bfloat16 graph exported in a float dtype QNN has
            if tuple(t.shape) != spec.shape or dtype_name(t.dtype) != spec.dtype:
                errors.append(
                    f"argument {spec.arg_index} ({spec.name}) is {dtype_name(t.dtype)}{list(t.shape)}, "
                    f"exported as {spec.dtype}{list(spec.shape)}"
                )
                continue
            t = t.detach()
            if spec.onnx_dtype != spec.dtype:
                if spec.dtype == "int64" and spec.onnx_dtype == "int32" and t.numel():
                    lo, hi = int(t.min()), int(t.max())
                    if lo < _INT32_MIN or hi > _INT32_MAX:
                        errors.append(
                            f"argument {spec.arg_index} ({spec.name}) holds int64 values in [{lo}, {hi}] "
                            "that do not fit int32 (QNN would saturate them); export with passes that "
                            "exclude 'int64_to_int32' to keep int64"
                        )
                        continue
                t = t.to(_dtype(spec.onnx_dtype))
            t = t.contiguous()
            out.append(t.reshape(spec.onnx_shape) if spec.onnx_shape is not None else t)
        if errors:
            raise SignatureError("cannot build ONNX inputs: " + "; ".join(errors) + ".")
        return out

    def assemble(self, onnx_outputs: Sequence[torch.Tensor], args: Sequence[Any]) -> Any:
        """Rebuild the graph module's output from the ONNX outputs and the Dynamo arguments.

        Args:
            onnx_outputs: ONNX session outputs in ONNX output order (torch tensors; numpy arrays are
                accepted and converted).
            args: All Dynamo arguments, for outputs that return an argument unchanged.

        Returns:
            A tuple or list shaped like the graph module's output (the bare value for ``single``). The same ONNX output used twice is
            returned as the same tensor object.
        """
        import numpy as np
        import torch

        if len(onnx_outputs) != len(self.onnx_output_names):
            raise SignatureError(
                f"assemble got {len(onnx_outputs)} ONNX outputs, the model has {len(self.onnx_output_names)} "
                f"({list(self.onnx_output_names)}); pass every session output in order."
            )
        converted: dict[int, torch.Tensor] = {}
        result: list[Any] = []
        for slot in self.outputs:
            if slot.kind == "onnx":
                t = converted.get(slot.index)
                if t is None:
                    raw = onnx_outputs[slot.index]
                    t = torch.from_numpy(np.asarray(raw)) if not isinstance(raw, torch.Tensor) else raw
                    if slot.dtype in COMPLEX_PARTS:
                        # A complex result comes back as its real pair [..., 2] (ONNX and QNN have no complex type).
                        t = torch.view_as_complex(t.to(_dtype(COMPLEX_PARTS[slot.dtype])).contiguous())
                    elif dtype_name(t.dtype) != slot.dtype:
                        t = t.to(_dtype(slot.dtype))
                    if slot.shape is not None:
                        t = t.reshape(slot.shape)
                    converted[slot.index] = t
                result.append(t)
            elif slot.kind == "arg":
                result.append(args[slot.index])
            elif slot.kind == "none":
                result.append(None)
            else:
                result.append(slot.value)
        if self.output_container == "single":
            return result[0]
        return tuple(result) if self.output_container == "tuple" else result

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serializable dict (lists and scalars only)."""
        return {
            "inputs": [
                {
                    "name": s.name,
                    "arg_index": s.arg_index,
                    "dtype": s.dtype,
                    "onnx_dtype": s.onnx_dtype,
                    "shape": list(s.shape),
                    **({"max_abs": s.max_abs} if s.max_abs is not None else {}),
                    **({"onnx_shape": list(s.onnx_shape)} if s.onnx_shape is not None else {}),
                }
                for s in self.inputs
            ],
            "outputs": [
                {
                    "kind": o.kind,
                    "index": o.index,
                    "dtype": o.dtype,
                    "value": o.value,
                    **({"shape": list(o.shape)} if o.shape is not None else {}),
                }
                for o in self.outputs
            ],
            "onnx_output_names": list(self.onnx_output_names),
            "onnx_output_dtypes": list(self.onnx_output_dtypes),
            "output_container": self.output_container,
            "writebacks": [list(w) for w in self.writebacks],
            "row_writebacks": [attrs.asdict(w) for w in self.row_writebacks],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GraphSignature:
        """Rebuild a signature from :meth:`to_dict` output."""
        try:
            return cls(
                inputs=tuple(
                    InputSpec(
                        name=s["name"],
                        arg_index=int(s["arg_index"]),
                        dtype=s["dtype"],
                        onnx_dtype=s["onnx_dtype"],
                        shape=tuple(int(x) for x in s["shape"]),
                        max_abs=None if s.get("max_abs") is None else int(s["max_abs"]),
                        onnx_shape=None if s.get("onnx_shape") is None else tuple(int(x) for x in s["onnx_shape"]),
                    )
                    for s in d["inputs"]
                ),
                outputs=tuple(
                    OutputSlot(
                        kind=o["kind"],
                        index=int(o["index"]),
                        dtype=o["dtype"],
                        value=o["value"],
                        shape=None if o.get("shape") is None else tuple(int(x) for x in o["shape"]),
                    )
                    for o in d["outputs"]
                ),
                onnx_output_names=tuple(d["onnx_output_names"]),
                onnx_output_dtypes=tuple(d["onnx_output_dtypes"]),
                output_container=d["output_container"],
                writebacks=tuple(tuple(w) for w in d.get("writebacks", ())),
                row_writebacks=tuple(RowWriteback(**w) for w in d.get("row_writebacks", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SignatureError(
                f"not a GraphSignature dict ({exc!r}); expected the output of GraphSignature.to_dict()."
            ) from exc
