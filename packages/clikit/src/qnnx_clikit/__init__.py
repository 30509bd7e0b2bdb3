"""The command-line conventions the qnnx tools share: ``--soc-model`` chip names, exit codes, one error shape."""

from qnnx_clikit._cli import EXIT_USAGE, Parser, UsageError, error, message_and_fix, out, parse_args
from qnnx_clikit._soc import CHIPS, Chip, chip_number, normalize_chip_name, soc_model
from qnnx_clikit._version import __version__

__all__ = [
    "CHIPS",
    "EXIT_USAGE",
    "Chip",
    "Parser",
    "UsageError",
    "__version__",
    "chip_number",
    "error",
    "message_and_fix",
    "normalize_chip_name",
    "out",
    "parse_args",
    "soc_model",
]
