"""``planner serve``: the explorer in the browser. A local web page that searches, shows the
plan with its runners-up and why-not reasons, the frontier of every configuration, memory
and step time by term, the pipeline timeline and a what-if strip over GPU counts and types,
and downloads the plan and each trainer's file. Everything it serves comes from the
installed package (``planner/web/static``); its figures are ``planner.figures`` charts."""

from planner.web.server import QUICK_START, Explorer, make_server

__all__ = ["QUICK_START", "Explorer", "make_server"]
