"""Machine-readable output, one convention for every command.

Invariants: ``--json`` is a flag on every command that reports something, and it means one thing:
print the command's result as JSON on stdout, instead of the human text, and nothing else there;
a file is ``-o/--output PATH`` (benchmarks: also write the results as JSON to PATH, whatever
stdout shows). Progress bars and messages go to stderr, so stdout under ``--json`` parses.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

JSON_HELP = "print the result as JSON on stdout (instead of the text)"


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help=JSON_HELP)


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json`` and ``-o/--output PATH``, for the benchmarks."""
    add_json_flag(parser)
    parser.add_argument("-o", "--output", metavar="PATH", type=Path, default=None,
                        help="also write the results as JSON to PATH")


def check_output_path(args: argparse.Namespace) -> None:
    """Raises ValueError when --output names a folder that does not exist (checked before a long run)."""
    path = getattr(args, "output", None)
    if path is not None and not path.parent.is_dir():
        raise ValueError(f"--output {path}: folder {path.parent} does not exist")


def json_safe(obj: Any) -> Any:
    """NaN and infinities become null (JSON has neither)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def emit_result(args: argparse.Namespace, result: dict, table: str) -> None:
    """Print ``table``, or the JSON of ``result`` under --json; write --output when given."""
    doc = json.dumps(json_safe(result), indent=2) + "\n"
    if getattr(args, "json", False):
        print(doc, end="")
    else:
        print(table)
    path = getattr(args, "output", None)
    if path is not None:
        path.write_text(doc)
