"""The explorer's web server (``planner serve``): the standard library's threading HTTP
server, serving the page and its scripts from the installed package (no CDN, no internet)
and a small JSON API. Searches run as background jobs the page polls for progress.

API (JSON bodies and answers):
- ``GET /api/options``: the presets, profiles and choices the form offers, and the
  quick-start job as its defaults.
- ``POST /api/plan`` (a form, or ``{"plan_json": text}``), ``POST /api/frontier`` and
  ``POST /api/whatif`` (``{"problem": key}``): start a job; ``{"job": id}``.
- ``GET /api/job/ID``: ``{"state": "running"|"done"|"failed", "progress": 0..1, "result"
  | "error": {"field", "message"}}``.
- ``POST /api/select`` (``{"problem", "cand"}``): one configuration in detail.
- ``GET /api/download?problem=&cand=&target=``: the plan JSON or an emitted file.
Bad input answers 400 with ``{"error": {"field", "message"}}``: the CLI's line, never a
traceback.
"""

from __future__ import annotations

import collections
import itertools
import json
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

import hardware_profiles
from costmodel import Infeasible, ModelSpec, SpecError
from costmodel.config import FRAMEWORK_NAMES, PRECISIONS, RECOMPUTE, SCHEDULES
from planner.cli.common import one_line
from planner.space import PRESETS
from planner.web import views
from planner.web.problems import (
    MAX_UPLOAD_BYTES,
    FormError,
    Problem,
    field_of,
    from_plan,
    load,
)

__all__ = ["QUICK_START", "Explorer", "ExplorerServer", "make_server"]

#: The form's first values: the README's quick-start job.
QUICK_START = {"model": "llama-3-70b", "gpu": "h100-sxm", "gpus": "64", "gpus_per_node": "8",
               "global_batch_size": "512", "seq_len": "8192"}
_STATIC = {"index.html": "text/html", "app.js": "text/javascript",
           "figures.js": "text/javascript", "style.css": "text/css"}
#: Problems and jobs kept in memory (the oldest are dropped).
KEEP_PROBLEMS = 16
KEEP_JOBS = 64


class NotFound(Exception):
    """A path the API does not have."""


def _options() -> dict[str, Any]:
    return {"models": ModelSpec.preset_names(), "clusters": hardware_profiles.names("clusters"),
            "gpus": hardware_profiles.names("gpus"), "frameworks": list(FRAMEWORK_NAMES),
            "presets": sorted(PRESETS), "precisions": list(PRECISIONS),
            "recompute": list(RECOMPUTE), "schedules": list(SCHEDULES),
            "downloads": list(views.DOWNLOADS), "defaults": QUICK_START}


def _error(e: BaseException) -> dict[str, str]:
    """A job's or request's failure as the CLI would print it."""
    if isinstance(e, FormError):
        return {"field": e.field, "message": e.message}
    if isinstance(e, Infeasible):
        return {"field": "", "message": f"planner: infeasible: {one_line(e)}"}
    if isinstance(e, SpecError):
        return {"field": field_of(str(e)), "message": f"planner: error: {one_line(e)}"}
    print(f"planner serve: internal error: {type(e).__name__}: {one_line(e)}",
          file=sys.stderr)
    return {"field": "", "message": f"planner: internal error: {type(e).__name__}: "
            f"{one_line(e)}"}


class Explorer:
    """The server's state: the problems asked (by key) and the jobs running or done."""

    def __init__(self) -> None:
        self.problems: collections.OrderedDict[str, Problem] = collections.OrderedDict()
        self.jobs: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def problem(self, key: Any) -> Problem:
        """A problem asked before."""
        with self._lock:
            found = self.problems.get(str(key))
        if found is None:
            raise FormError("", "planner: error: that search is no longer held by the server; "
                            "search again")
        return found

    def keep(self, problem: Problem) -> Problem:
        """Remember ``problem`` (or return the one already asked with the same key)."""
        with self._lock:
            if problem.key in self.problems:
                self.problems.move_to_end(problem.key)
                return self.problems[problem.key]
            self.problems[problem.key] = problem
            while len(self.problems) > KEEP_PROBLEMS:
                self.problems.popitem(last=False)
            return problem

    def start(self, work: Callable[[Callable[[float], None]], Any]) -> str:
        """Run ``work(progress)`` in a thread as a job; its id."""
        job_id = str(next(self._ids))
        job: dict[str, Any] = {"state": "running", "progress": 0.0, "started": time.time()}
        with self._lock:
            self.jobs[job_id] = job
            while len(self.jobs) > KEEP_JOBS:
                self.jobs.popitem(last=False)

        def progress(fraction: float) -> None:
            job["progress"] = max(0.0, min(1.0, float(fraction)))

        def run() -> None:
            try:
                job["result"] = work(progress)
                job["state"] = "done"
            except Exception as e:  # every failure reaches the page as one line
                job["error"] = _error(e)
                job["state"] = "failed"
            job["seconds"] = time.time() - job["started"]

        threading.Thread(target=run, daemon=True).start()
        return job_id

    def job(self, job_id: str) -> dict[str, Any]:
        """A job's state (its result once done)."""
        with self._lock:
            found = self.jobs.get(job_id)
        if found is None:
            raise FormError("", "planner: error: unknown job")
        return {k: v for k, v in found.items() if k != "started"}

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Answer a POST."""
        if path == "/api/plan":
            if body.get("plan_json"):
                problem = self.keep(from_plan(str(body["plan_json"])))
            else:
                problem = self.keep(load(body))
            return {"job": self.start(lambda p: views.plan_view(problem, p)),
                    "problem": problem.key}
        if path in ("/api/frontier", "/api/whatif"):
            problem = self.problem(body.get("problem"))
            view = views.frontier_view if path == "/api/frontier" else views.whatif_view
            return {"job": self.start(lambda p: view(problem, p))}
        if path == "/api/select":
            return views.selection(self.problem(body.get("problem")), str(body.get("cand")))
        raise NotFound(path)


class ExplorerServer(ThreadingHTTPServer):
    """The HTTP server, holding the ``Explorer`` its requests share."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, Handler)
        self.explorer = Explorer()


class Handler(BaseHTTPRequestHandler):
    """One request: the page, its static files, or the JSON API."""

    server_version = "planner-serve"
    server: ExplorerServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the page polls often."""

    def _send(self, status: int, body: bytes, kind: str,
              extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, value: Any) -> None:
        self._send(status, json.dumps(value).encode(), "application/json")

    def _fail(self, e: BaseException) -> None:
        status = HTTPStatus.BAD_REQUEST if isinstance(e, FormError | SpecError | Infeasible) \
            else HTTPStatus.INTERNAL_SERVER_ERROR
        self._json(status, {"error": _error(e)})

    def _not_found(self) -> None:
        self._json(404, {"error": {"field": "", "message": "not found"}})

    def do_GET(self) -> None:
        """The page, a static file, the options, a job's state or a download."""
        url = urlsplit(self.path)
        explorer = self.server.explorer
        try:
            if url.path in ("/", "/index.html"):
                self._static("index.html")
            elif url.path.startswith("/static/"):
                self._static(url.path[len("/static/"):])
            elif url.path == "/api/options":
                self._json(200, _options())
            elif url.path.startswith("/api/job/"):
                self._json(200, explorer.job(url.path[len("/api/job/"):]))
            elif url.path == "/api/download":
                self._download(parse_qs(url.query))
            else:
                self._not_found()
        except Exception as e:
            self._fail(e)

    def _static(self, name: str) -> None:
        if name not in _STATIC:  # only the page's own files: no path reaches the disk
            self._not_found()
            return
        data = resources.files("planner.web").joinpath(f"static/{name}").read_bytes()
        self._send(200, data, _STATIC[name] + "; charset=utf-8")

    def _download(self, query: dict[str, list[str]]) -> None:
        def arg(name: str) -> str:
            return (query.get(name) or [""])[0]

        name, text = views.download(self.server.explorer.problem(arg("problem")), arg("cand"),
                                    arg("target"))
        self._send(200, text.encode(), "application/octet-stream",
                   {"Content-Disposition": f'attachment; filename="{name}"'})

    def do_POST(self) -> None:
        """Start a search, or show one configuration."""
        try:
            size = int(self.headers.get("Content-Length") or 0)
            if size > 2 * MAX_UPLOAD_BYTES:
                raise FormError("", f"planner: error: the request is over "
                                f"{2 * MAX_UPLOAD_BYTES // 1024} KiB")
            body = json.loads(self.rfile.read(size) or b"{}")
            if not isinstance(body, dict):
                raise FormError("", "planner: error: the request is not a JSON object")
            self._json(200, self.server.explorer.post(urlsplit(self.path).path, body))
        except NotFound:
            self._not_found()
        except json.JSONDecodeError:
            self._json(400, {"error": {"field": "", "message": "planner: error: the request "
                                       "is not JSON"}})
        except Exception as e:
            self._fail(e)


def make_server(host: str = "127.0.0.1", port: int = 8765) -> ExplorerServer:
    """The explorer's HTTP server bound to ``host``:``port`` (``port`` 0: any free one);
    call ``serve_forever`` on it."""
    return ExplorerServer((host, port))
