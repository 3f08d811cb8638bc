"""`mibyan batch`: its log goes to $MIBYAN_HOME/logs/batch.log; the command itself is mibyan.batch's."""

from __future__ import annotations

import argparse


def run_batch(args: argparse.Namespace) -> int:
    from mibyan.batch.command import run_batch as run
    from mibyan.cli.logs import setup_logging
    from mibyan.config.paths import mibyan_home

    if args.action == "run":
        setup_logging(mibyan_home(), file_name="batch.log")
    return run(args)
