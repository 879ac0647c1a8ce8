"""``python -m atmostonce.conformance``: the same as ``atmostonce conformance``."""

import sys

from .cli import run_cli

sys.exit(run_cli())
