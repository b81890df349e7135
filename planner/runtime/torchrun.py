"""``python -m planner.runtime.torchrun ARGS``: torchrun (``torch.distributed.run``) with the
same arguments, which ends with one line instead of a traceback when a signal stops it.

torchrun stops its workers on SIGINT, SIGTERM or SIGHUP by raising ``SignalException`` from
its signal handler (``torch/distributed/elastic/multiprocessing/api.py``); uncaught, that
prints a traceback after the workers are gone. Here it becomes ``torchrun: stopped by
SIGTERM`` and exit status ``128 + signal``, as a shell reports a process a signal ended.
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main


def run() -> int:
    """torchrun's ``main`` on ``sys.argv``; its exit status."""
    try:
        main()
    except SignalException as e:
        print(f"torchrun: stopped by {e.sigval.name}; its workers were stopped",
              file=sys.stderr, flush=True)
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(run())
