"""Run a file written by :func:`qnnx_backend.save` without torch: numpy arrays in, numpy arrays out (public as
:func:`qnnx_backend.load_arrays`).

This module imports no torch, and neither does ``import qnnx_backend``: it reads the payload
(:mod:`qnnx_backend._payload`), creates the QNN session from the saved context through qnnx-detection
(onnxruntime and onnxruntime-qnn), and applies the saved call plan with numpy. It serves files whose inputs are
tensors and constants given as positional or keyword arguments (no nesting) and whose graph runs wholly on its QNN
device: vision and encoder models. Outputs come back as a dict keyed by the output's name (``last_hidden_state``,
``0``), in the model's order.
"""

from __future__ import annotations

import logging
import os
import shutil
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qnnx_backend import _payload, _scratch
from qnnx_backend._parts import PartedModel, open_parts
from qnnx_backend._untrusted import (
    UntrustedRun,
    check_half_range,
    check_inputs,
    check_integer_inputs,
    integer_bounds,
)
from qnnx_backend.errors import QnnDeviceError, QnnRuntimeError, SavedGraphError, SavedInputError

logger = logging.getLogger(__name__)

_NUMPY_DTYPES = ("float32", "float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
_INT32 = (-(2**31), 2**31 - 1)


def load_arrays(path: str | os.PathLike[str]) -> ArrayModel:
    """Load a file written by :func:`qnnx_backend.save` for numpy arrays, in a process that need not have torch.

    Raises:
        SavedGraphError: the file is not a saved model, is damaged, or holds what only :func:`qnnx_backend.load`
            runs (nested inputs, several graphs, a graph split with the CPU, a dtype numpy lacks).
        QnnDeviceError: the saved context cannot serve here and ``strict`` was saved, or no QNN session can be
            created from the file.
    """
    data = Path(path).read_bytes()
    header, blobs = _payload.unpack_payload(data)
    if not isinstance(header.get("call"), dict):
        raise SavedGraphError(
            f"{os.fspath(path)} holds no model call section (it was not written by qnnx_backend.save); save the "
            "model with qnnx_backend.save"
        )
    try:
        return ArrayModel(header, blobs)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        if isinstance(exc, SavedGraphError | QnnDeviceError):
            raise
        raise SavedGraphError(f"the saved model's header is malformed ({exc!r}); save the model again") from exc


def _only_here(what: str) -> SavedGraphError:
    return SavedGraphError(
        f"{what}; load_arrays runs single-graph files with flat tensor inputs: use qnnx_backend.load"
    )


class ArrayModel:
    """A saved model for numpy: ``model(*arrays, **named_arrays) -> {output name: array}``.

    Each call is checked against the saved inputs (dtype and shape of every array, value of every constant); all
    mismatches are named in one :class:`~qnnx_backend.errors.SavedInputError`.
    """

    def __init__(self, header: Mapping[str, Any], blobs: Sequence[memoryview]) -> None:
        import qnnx_detection

        call, graph, options = header["call"], header["graph"], header["options"]
        variants = graph["variants"]
        if len(variants) != 1 or variants[0]["kind"] != "qnn":
            raise _only_here(f"the file holds {len(variants)} graph(s) of kind {[v['kind'] for v in variants]}")
        record = variants[0]
        self._inputs = [dict(r) for r in call["inputs"]]
        for r in self._inputs:
            if not isinstance(r.get("key"), list):
                raise _only_here(f"input {r['name']} is nested in a container")
            if r["tensor"] and r["dtype"] not in _NUMPY_DTYPES:
                raise _only_here(f"input {r['name']} is {r['dtype']}, which numpy lacks")
        self._graph_args = [None if a is None else int(a) for a in call["graph_args"]]
        self._outputs = [dict(r) for r in call["outputs"]]
        self._signature = record["signature"]
        self._int_bounds = integer_bounds(self._signature["inputs"])
        # Inputs beyond float16's range are clipped only where the saving process found that exact, or compiled
        # without the accuracy guard (no PyTorch here to check it), or saved before it recorded the decision.
        self._clip = record.get("clip_inputs", "trusted") in ("verified", "trusted")
        self._out_dtypes = list(record["out_dtypes"])
        self.model_name = str(call["model"])
        """The class of the model that was saved (``module.QualName``), for messages."""
        self.input_names = tuple(r["name"] for r in self._inputs)
        self.output_names = tuple(r["name"] for r in self._outputs)
        self._folder = _scratch.make_dir("arrays")
        weakref.finalize(self, shutil.rmtree, str(self._folder), True)

        device = str(record["device"])
        soc = options.get("soc_model")
        soc = int(soc) if soc is not None else qnnx_detection.resolve_soc_model(None)
        session_record = record["session"]
        provider_options = {str(k): str(v) for k, v in session_record["provider_options"].items()}
        allow_cpu_fallback = bool(session_record["allow_cpu_fallback"])
        v = qnnx_detection.probe(initialize=False).versions
        here = {"onnxruntime": str(v.onnxruntime), "onnxruntime-qnn": str(v.onnxruntime_qnn), "qairt": str(v.qairt)}
        saved = {k: val for k, val in header["fingerprint"].items() if k != "options"}
        differences = _payload.fingerprint_differences(saved, here)
        if int(record["soc_model"]) != soc:
            differences.append(f"soc_model {record['soc_model']!r} (here: {soc!r})")
        files = record["context"]
        if differences:
            if options.get("strict"):
                raise QnnDeviceError(
                    device,
                    f"the saved context does not match this machine: {'; '.join(differences)}. Save it again with "
                    "this configuration, or with strict=False to rebuild it here from its saved ONNX model",
                )
            if allow_cpu_fallback:
                raise _only_here("the saved graph is split with ONNX Runtime's CPU EP and must be rebuilt here")
            logger.warning(
                "qnn backend: saved context does not match this machine (%s); rebuilding it from its saved ONNX model",
                "; ".join(differences),
            )
            files = record["model"]
        model_path = self._write(files, blobs)

        def create(path: str) -> Any:
            return qnnx_detection.create_session(
                path, device, soc_model=soc, provider_options=provider_options, allow_cpu_fallback=allow_cpu_fallback
            )

        try:
            if files.get("parts") is None:
                self._session = create(str(model_path))
            else:  # a graph too large for one context: one session per part, chained
                parts = PartedModel.from_metadata(self._folder, files["parts"])
                self._session = open_parts(parts, lambda _k, path: create(path))
        except qnnx_detection.errors.SessionCreationError as exc:
            raise QnnDeviceError(device, f"the saved graph did not load ({exc.cause})") from exc
        self._output_order = [o.name for o in self._session.get_outputs()]

    def _write(self, files: Mapping[str, Any], blobs: Sequence[memoryview]) -> Path:
        for name, index in files["files"].items():
            if not _payload.SAFE_NAME.fullmatch(name) or not isinstance(index, int) or not 0 <= index < len(blobs):
                raise SavedGraphError(f"the saved model lists a bad file entry {name!r}: {index!r}; save it again")
            (self._folder / name).write_bytes(blobs[index])
        return self._folder / str(files["model_file"])

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        import numpy as np

        leaves, problems = bind_arrays(self._inputs, args, kwargs)
        if problems:
            raise SavedInputError(
                f"the loaded {self.model_name} cannot take these inputs: {'; '.join(problems)}. It takes "
                f"({', '.join(_expected(r) for r in self._inputs)})"
            )
        graph_args = [None if a is None else leaves[a] for a in self._graph_args]
        feed = {}
        for spec in self._signature["inputs"]:
            array = np.ascontiguousarray(graph_args[spec["arg_index"]])
            if spec["onnx_dtype"] == "int32" and array.dtype == np.int64 and array.size:
                lo, hi = int(array.min()), int(array.max())
                if lo < _INT32[0] or hi > _INT32[1]:
                    raise SavedInputError(
                        f"input {spec['name']} holds int64 values in [{lo}, {hi}], beyond int32, which the saved "
                        "graph takes (QNN would saturate them); keep the values within int32"
                    )
            array = array.astype(spec["onnx_dtype"], copy=False)
            # An integer input of rank 5 or more runs with its leading dims merged (a view: nothing is copied).
            feed[spec["name"]] = array.reshape(spec["onnx_shape"]) if spec.get("onnx_shape") is not None else array
        floats = [spec["name"] for spec in self._signature["inputs"] if spec["onnx_dtype"] in ("float32", "float16")]
        try:
            check_inputs(floats, feed, clip=self._clip)
            check_integer_inputs(self._int_bounds, feed)
            outs = self._session.run(self._output_order, feed)
            check_half_range(self._output_order, outs)
        except UntrustedRun as untrusted:
            raise QnnRuntimeError(
                f"the loaded {self.model_name}: {untrusted}; {untrusted.why}, so this call's results cannot be trusted "
                "(and there is no PyTorch here to compute it). Fix: keep the inputs finite and the graph's values "
                "within +-65504 and the integer inputs within the bound named, or compute such inputs with the "
                "compiled model (device='auto' computes them in PyTorch)."
            ) from untrusted
        slots: list[Any] = []
        for k, slot in enumerate(self._signature["outputs"]):
            if slot["kind"] == "onnx":
                value = outs[slot["index"]]
                want = self._out_dtypes[k] if k < len(self._out_dtypes) and self._out_dtypes[k] else slot["dtype"]
                if slot["dtype"] == "complex64":  # a complex result comes back as its real pair [..., 2]
                    pair = np.ascontiguousarray(value, dtype=np.float32)
                    slots.append(pair.view(np.complex64).reshape(pair.shape[:-1]))
                    continue
                value = value.astype(want, copy=False) if value.dtype != np.dtype(want) else value
                slots.append(value.reshape(slot["shape"]) if slot.get("shape") is not None else value)
            elif slot["kind"] == "arg":
                slots.append(graph_args[slot["index"]])
            elif slot["kind"] == "none":
                slots.append(None)
            else:
                slots.append(slot["value"])
        return {
            r["name"]: slots[r["graph"]] if "graph" in r else leaves[r["input"]] if "input" in r else r["value"]
            for r in self._outputs
        }


def bind_arrays(
    inputs: Sequence[Mapping[str, Any]], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[list[Any], list[str]]:
    """The value of each saved input (the ``inputs`` records of a file's call section) taken from a call's arrays
    (constants may be left out), and every mismatch, as human lines."""
    import numpy as np

    positional = [r for r in inputs if r["key"][0] == "args"]
    named = {r["key"][1]: r for r in inputs if r["key"][0] == "kwargs"}
    problems = []
    if len(args) > len(positional):
        problems.append(f"{len(args)} positional inputs, the model takes {len(positional)}")
    unknown = sorted(set(kwargs) - set(named))
    if unknown:
        problems.append(f"unknown keyword input(s) {unknown}; accepted: {sorted(named)}")
    leaves: list[Any] = []
    for r in inputs:
        kind, key = r["key"]
        given = (key < len(args)) if kind == "args" else (key in kwargs)
        value = (args[key] if kind == "args" else kwargs[key]) if given else None
        if not r["tensor"]:
            if given and not (type(value) is type(r["value"]) and value == r["value"]):
                problems.append(f"{r['name']} is {value!r}, saved as the constant {r['value']!r}")
            leaves.append(r["value"])
            continue
        if not given:
            problems.append(f"{r['name']} is missing (saved as {_expected(r, bare=True)})")
        elif not isinstance(value, np.ndarray):
            problems.append(f"{r['name']} is a {type(value).__name__}, not a numpy array")
        elif str(value.dtype) != r["dtype"] or list(value.shape) != r["shape"]:
            got = f"{value.dtype}{list(value.shape)}"
            problems.append(f"{r['name']} is {got}, saved as {_expected(r, bare=True)}")
        leaves.append(value)
    return leaves, problems


def _expected(record: Mapping[str, Any], *, bare: bool = False) -> str:
    value = f"{record['dtype']}{record['shape']}" if record["tensor"] else repr(record["value"])
    return value if bare else f"{record['name']}: {value}"
