"""The call section of a file written by qnnx_backend.save: it survives the payload round trip, and the load-time
checks accept exactly the saved inputs and name every mismatch (the graph itself is stood in for by a function that
returns the arguments it is given: these tests are about binding, which the simulator is not needed for)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import given
from hypothesis import strategies as st

from qnnx_backend import _arrays, _payload, _saved
from qnnx_backend.errors import SavedInputError

_DTYPES = [torch.float32, torch.float16, torch.int64, torch.int32, torch.bool]
shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3)
tensors = st.builds(lambda dtype, shape: torch.zeros(shape, dtype=dtype), st.sampled_from(_DTYPES), shapes)
constants = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from(["a", "b"]))
leaves = st.one_of(tensors, tensors, constants)
names = st.sampled_from(["attention_mask", "pixel_values", "use_cache", "mode"])
calls = st.tuples(st.lists(leaves, min_size=1, max_size=4).map(tuple), st.dictionaries(names, leaves, max_size=3))


def _call_section(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call section save() writes for these example inputs, each tensor feeding one graph argument."""
    kwargs = dict(sorted(kwargs.items()))
    flat, spec = pytree.tree_flatten_with_path((args, kwargs))
    inputs = [_saved._input_record(_saved._label(p), _saved._flat_key(p), leaf) for p, leaf in flat]
    graph_args = [k for k, (_, leaf) in enumerate(flat) if isinstance(leaf, torch.Tensor)]
    return {
        "format": _saved.CALL_FORMAT,
        "model": "tests.Model",
        "in_spec": _saved._dumps(spec, "inputs"),
        "in_modules": _saved._spec_modules(spec),
        "inputs": inputs,
        "graph_args": graph_args,
        "out_spec": _saved._dumps(pytree.tree_flatten(tuple(range(len(graph_args))))[1], "outputs"),
        "out_modules": [],
        "outputs": [{"name": str(k), "graph": k} for k in range(len(graph_args))],
        "producer": {},
    }


def _loaded(call: dict[str, Any]) -> _saved.LoadedModel:
    """The call section read back from a payload, over a graph that returns its arguments."""
    header, _ = _payload.unpack_payload(_payload.pack_payload({"call": call}, []))
    model = _saved.LoadedModel(header["call"])
    model._graph = lambda *graph_args: tuple(graph_args)
    return model


@given(calls)
def test_the_saved_inputs_are_accepted_and_bound_to_their_graph_arguments(example: tuple[Any, Any]) -> None:
    """Called with inputs like its examples (kwargs in any order), a loaded model feeds each tensor to its graph
    argument and returns the graph's outputs in the saved structure."""
    args, kwargs = example
    model = _loaded(_call_section(args, kwargs))
    out = model(*args, **dict(reversed(list(kwargs.items()))))
    want = tuple(leaf for leaf in pytree.tree_leaves((args, dict(sorted(kwargs.items())))) if torch.is_tensor(leaf))
    assert len(out) == len(want) and all(a is b for a, b in zip(out, want, strict=True))


@given(calls, st.data())
def test_any_changed_tensor_is_refused_naming_it_and_both_forms(example: tuple[Any, Any], data: Any) -> None:
    """Another dtype or shape for any one tensor input: SavedInputError naming the input, what it got, what it was
    saved as, and the fix."""
    args, kwargs = example
    flat, spec = pytree.tree_flatten_with_path((args, dict(sorted(kwargs.items()))))
    positions = [k for k, (_, leaf) in enumerate(flat) if torch.is_tensor(leaf)]
    if not positions:
        return
    model = _loaded(_call_section(args, kwargs))
    k = data.draw(st.sampled_from(positions))
    old = flat[k][1]
    new = data.draw(tensors.filter(lambda t: t.dtype != old.dtype or t.shape != old.shape))
    values = [leaf for _, leaf in flat]
    values[k] = new
    changed_args, changed_kwargs = pytree.tree_unflatten(values, spec)
    name = _saved._label(flat[k][0])
    with pytest.raises(SavedInputError) as info:
        model(*changed_args, **changed_kwargs)
    message = str(info.value)
    assert f"{name} is {_saved._describe(new)}, saved as {_saved._describe(old)}" in message
    assert "save the model again" in message


@given(calls)
def test_a_missing_or_extra_input_is_refused_with_the_saved_signature(example: tuple[Any, Any]) -> None:
    """A call with one positional input fewer, or an unknown keyword, names the inputs the model takes."""
    args, kwargs = example
    model = _loaded(_call_section(args, kwargs))
    with pytest.raises(SavedInputError, match=r"takes \("):
        model(*args[:-1], **kwargs)
    with pytest.raises(SavedInputError, match=r"Pass the same positional and keyword inputs"):
        model(*args, unknown_input=1, **kwargs)


@given(calls, st.data())
def test_the_torch_free_binding_accepts_exactly_the_saved_arrays(example: tuple[Any, Any], data: Any) -> None:
    """bind_arrays (load_arrays' check) takes the same inputs as numpy arrays, constants optional; another shape
    or dtype is named."""
    args, kwargs = example
    inputs = _call_section(args, kwargs)["inputs"]
    as_array = lambda v: v.numpy() if torch.is_tensor(v) else v  # noqa: E731
    np_args, np_kwargs = [as_array(a) for a in args], {k: as_array(v) for k, v in kwargs.items()}
    bound, problems = _arrays.bind_arrays(inputs, np_args, np_kwargs)
    assert problems == []
    assert len(bound) == len(inputs)
    named = [k for k, v in np_kwargs.items() if isinstance(v, np.ndarray)]
    if not named:
        return
    key = data.draw(st.sampled_from(named))
    np_kwargs[key] = np_kwargs[key].reshape(-1)[:0]  # zero elements: another shape always
    _, problems = _arrays.bind_arrays(inputs, np_args, np_kwargs)
    assert len(problems) == 1 and problems[0].startswith(f"kwargs['{key}'] is ")


@given(calls, st.data())
def test_a_changed_constant_is_refused_naming_both_values(example: tuple[Any, Any], data: Any) -> None:
    """A non-tensor input is fixed to its saved value (as Dynamo specializes it): another value is named."""
    args, kwargs = example
    flat, spec = pytree.tree_flatten_with_path((args, dict(sorted(kwargs.items()))))
    positions = [k for k, (_, leaf) in enumerate(flat) if not torch.is_tensor(leaf)]
    if not positions:
        return
    model = _loaded(_call_section(args, kwargs))
    k = data.draw(st.sampled_from(positions))
    new = data.draw(constants.filter(lambda v: type(v) is not type(flat[k][1]) or v != flat[k][1]))
    values = [leaf for _, leaf in flat]
    values[k] = new
    changed_args, changed_kwargs = pytree.tree_unflatten(values, spec)
    with pytest.raises(SavedInputError, match="saved as the constant"):
        model(*changed_args, **changed_kwargs)
