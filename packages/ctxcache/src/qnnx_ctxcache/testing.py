"""Fakes for testing code that uses qnnx-ctxcache without onnxruntime or QNN.

:class:`FakeBuild` writes what the QNN EP writes (a small ONNX model with one ``EPContext`` node in
domain ``com.microsoft`` that references a ``*_qnn.bin`` file by relative name, ``embed_mode=0``)
with a payload you choose, so stores, races and corruption can be exercised on any machine.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from qnnx_ctxcache import _verify
from qnnx_ctxcache._results import BuildResult

__all__ = ["FakeBuild", "forget_verified", "write_fake_context"]


def write_fake_context(
    directory: Path,
    *,
    payload: bytes,
    model_file: str = "model_ctx.onnx",
    bin_file: str | None = "model_ctx_qnn.bin",
    embed_mode: int = 0,
) -> None:
    """Write an EPContext model (and its binary) the way the QNN EP 2.7.0 lays them out.

    Args:
        directory: an existing directory.
        payload: the context binary bytes.
        model_file: name of the ``_ctx.onnx`` file.
        bin_file: name of the binary written beside it (``embed_mode=0``); None writes a model with no
            EPContext node at all (what a build looks like when the EP compiled nothing).
        embed_mode: 1 embeds ``payload`` in the node instead of writing ``bin_file``.
    """
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    if bin_file is None:
        node = helper.make_node("Identity", ["x"], ["y"], name="cpu_identity")
    else:
        cache = payload if embed_mode else bin_file.encode("utf-8")
        node = helper.make_node(
            "EPContext",
            ["x"],
            ["y"],
            name="QNNExecutionProvider_fake_0_0",
            domain="com.microsoft",
            main_context=1,
            ep_cache_context=cache,
            embed_mode=embed_mode,
            ep_sdk_version="fake",
            source="QNNExecutionProvider",
            partition_name="QNNExecutionProvider_fake_0_0",
        )
        if not embed_mode:
            (directory / bin_file).write_bytes(payload)
    graph = helper.make_graph([node], "fake_ctx", [x], [y])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    onnx.save(model, str(directory / model_file))


@attrs.define(kw_only=True)
class FakeBuild:
    """A build callback for :meth:`ContextStore.get_or_create` that writes a fake context.

    Attributes:
        payload: bytes of the context binary.
        sleep: seconds to wait before writing (to widen race windows).
        fail: exception to raise instead of building.
        no_ep_context: write a model with no EPContext node.
        skip_bin: write the model but not the binary it references.
        count_file: a file that gets one line appended per call (counts builds across processes).
        metadata: returned in the BuildResult.
        calls: number of calls in this process.
    """

    payload: bytes = b"\x01fake-context\x02" * 64
    sleep: float = 0.0
    fail: BaseException | None = None
    no_ep_context: bool = False
    skip_bin: bool = False
    count_file: Path | None = None
    metadata: Mapping[str, Any] = attrs.field(factory=lambda: {"outputs": ["y"]})
    calls: int = 0

    def __call__(self, staging: Path) -> BuildResult:
        self.calls += 1
        if self.count_file is not None:
            with open(self.count_file, "a", encoding="utf-8") as fh:
                fh.write(f"{os.getpid()}\n")
        if self.sleep:
            time.sleep(self.sleep)
        if self.fail is not None:
            raise self.fail
        write_fake_context(staging, payload=self.payload, bin_file=None if self.no_ep_context else "model_ctx_qnn.bin")
        if self.skip_bin:
            (staging / "model_ctx_qnn.bin").unlink()
        return BuildResult(model_file="model_ctx.onnx", metadata=self.metadata)


def forget_verified() -> None:
    """Make this process treat every entry as never verified (as a fresh process would)."""
    with _verify.VERIFIED_LOCK:
        _verify.VERIFIED.clear()
