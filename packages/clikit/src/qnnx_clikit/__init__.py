"""The conventions the qnnx packages share: ``--soc-model`` chip names, exit codes, one error shape on the command
line, former public names that warn for one minor release, and the measured QNN HTP facts that more than one
package reads."""

from qnnx_clikit._cli import (
    EXIT_USAGE,
    Parser,
    UsageError,
    command_parser,
    error,
    error_of,
    message_and_fix,
    out,
    parse_args,
    run_main,
)
from qnnx_clikit._htp import RANDOM_OPS, htp_averages_wrongly, htp_pads_wrongly, merges_heads
from qnnx_clikit._renamed import renamed_attributes
from qnnx_clikit._soc import CHIPS, Chip, chip_number, normalize_chip_name, soc_model
from qnnx_clikit._version import __version__

__all__ = [
    "CHIPS",
    "EXIT_USAGE",
    "RANDOM_OPS",
    "Chip",
    "Parser",
    "UsageError",
    "__version__",
    "chip_number",
    "command_parser",
    "error",
    "error_of",
    "htp_averages_wrongly",
    "htp_pads_wrongly",
    "merges_heads",
    "message_and_fix",
    "normalize_chip_name",
    "out",
    "parse_args",
    "renamed_attributes",
    "run_main",
    "soc_model",
]
