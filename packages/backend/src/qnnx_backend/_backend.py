"""The ``qnn`` torch.compile backend entry point (private; public as :func:`qnnx_backend.qnn_backend`)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from qnnx_backend._options import BackendOptions
from qnnx_backend.errors import InvalidOptionsError

_LOG_ENV = "QNNX_LOG"
_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
_logging_done = threading.Event()


def _configure_logging_from_env() -> None:
    """``QNNX_LOG=debug|info|warning`` turns on qnnx logging to stderr without code changes (read once)."""
    if _logging_done.is_set():
        return
    _logging_done.set()
    raw = os.environ.get(_LOG_ENV, "").strip().lower()
    if not raw:
        return
    level = _LOG_LEVELS.get(raw)
    if level is None:
        logging.getLogger(__name__).warning(
            "%s=%r is not valid; accepted: %s", _LOG_ENV, raw, ", ".join(sorted(_LOG_LEVELS))
        )
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    for name in ("qnnx_backend", "qnnx_detection", "qnnx_export", "qnnx_opcheck", "qnnx_ctxcache"):
        lg = logging.getLogger(name)
        lg.setLevel(level)
        lg.addHandler(handler)


def qnn_backend(
    gm: Any,
    example_inputs: Sequence[object],
    *,
    options: Mapping[str, Any] | BackendOptions | None = None,
    mode: str | None = None,
) -> Any:
    """Compile one Dynamo FX graph for Qualcomm QNN (the function behind ``torch.compile(backend="qnn")``).

    Args:
        gm: the FX graph Dynamo captured (never mutated).
        example_inputs: its example arguments, lifted parameters and buffers included.
        options: see :class:`BackendOptions`; validated before any work.
        mode: torch.compile's ``mode``; only ``None``/``"default"`` is meaningful for QNN.

    Returns:
        A callable taking the same arguments as ``gm`` and returning the same structure.
    """
    try:
        opts = BackendOptions.from_mapping(options)
        if mode not in (None, "default"):
            raise InvalidOptionsError(
                f"mode={mode!r} is not supported by backend='qnn'; accepted: None or 'default'. "
                "Tune QNN with options such as provider_options={'htp_performance_mode': 'burst'}."
            )
    except InvalidOptionsError as exc:
        if gm is None:  # called directly, not by Dynamo
            raise
        # Dynamo wraps whatever a backend raises into BackendCompilerFailed; raising from the compiled function
        # instead lets the user catch InvalidOptionsError (a ValueError) as such. No work is done either way.
        return _RaiseOnCall(exc)
    _configure_logging_from_env()
    from qnnx_backend._compiled import QnnGraph

    return QnnGraph(gm, example_inputs, opts)


class _RaiseOnCall:
    """The compiled function of a graph whose options are invalid: it raises the options error when called."""

    def __init__(self, error: InvalidOptionsError) -> None:
        self._error = error

    def __call__(self, *args: object) -> Any:
        raise self._error


def is_available(device: str | None = None) -> bool:
    """Whether a QNN accelerator is usable here (``device=None``: NPU or GPU; or ``"npu"``/``"gpu"``).

    Reads qnnx-detection's probe: the backend really initializes once per process (cached).
    """
    import qnnx_detection

    if device is not None and device not in ("npu", "gpu", "htp"):
        raise InvalidOptionsError(f"device={device!r} is not valid here; accepted: None, 'npu', 'gpu'.")
    return qnnx_detection.is_available(device)  # detection accepts "htp" as another name for "npu"
