"""``planner serve``: the interactive explorer, a local web page (``planner.web``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from costmodel import SpecError
from planner.cli.common import add_command

if TYPE_CHECKING:
    from planner.cli.common import Subparsers

EPILOG = """examples:
  planner serve                       # then open http://127.0.0.1:8765/
  planner serve --port 9000
  planner serve --host 0.0.0.0        # reachable from other machines (no authentication)
"""


def _port(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 to 65535; 0: any "
                                         "free port)")
    return n


def add_parser(sub: Subparsers) -> None:
    """Add ``planner serve`` to ``sub``."""
    p = add_command(
        sub, "serve", help="the interactive explorer in the browser",
        description="Start a local web page to explore plans: pick a model (a preset or an "
        "uploaded config.json) and a cluster, see the plan with its runners-up and why the "
        "others lost, the frontier of every configuration (step time or cost against memory), "
        "memory and step time by term, the pipeline timeline, what other GPU counts and types "
        "would give, and download the plan and each trainer's file. Everything is served "
        "from the installed package; no internet. Stop it with Ctrl-C.", epilog=EPILOG)
    p.add_argument("--port", type=_port, default=8765, help="port (default 8765; 0: any free)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """``planner serve``: run the explorer until interrupted."""
    from planner.web import make_server

    try:
        server = make_server(args.host, args.port)
    except OSError as e:
        raise SpecError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}; "
                        "choose another --port or --host") from None
    host, port = server.server_address[:2]
    print(f"planner explorer on http://{host!s}:{port}/  (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
