"""A static file server for dist/site/: the right MIME types and cross-origin isolation headers.

WebAssembly must come as application/wasm (streaming compilation refuses anything else) and ES
modules as a JavaScript type. COOP same-origin + COEP require-corp make the page cross-origin
isolated (SharedArrayBuffer, precise timers), which is also a cheap proof that nothing from
another origin is embedded. The runtime does not need them: e2e runs the pages from a plain
http.server too (e2e/conftest.py's plain_site_url). `Cache-Control: no-cache` makes the browser revalidate, so a rebuilt
site is never mixed with a stale one (weights are cached in OPFS, not by HTTP). It answers
Range requests (`bytes=START-` or `bytes=START-END`, one range) with 206 Partial Content: the
worker resumes a dropped download from the byte it reached. `files` adds local files outside
the site at URLs of their own (`build.py demo --model PATH`: the GGUF at local/NAME); nothing
else outside the site is served.

Not here: building the site (site.py).
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import socketserver
import threading
import urllib.parse
from pathlib import Path

MIME = {".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript",
        ".json": "application/json", ".html": "text/html; charset=utf-8",
        ".css": "text/css", ".gguf": "application/octet-stream", ".whl": "application/zip",
        ".zip": "application/zip", ".wgsl": "text/plain; charset=utf-8"}


class SiteHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, **MIME}
    quiet = True
    files: dict = {}    # URL path (no leading slash) -> a local file served there

    def translate_path(self, path: str) -> str:
        route = urllib.parse.unquote(path.split("?", 1)[0].split("#", 1)[0]).lstrip("/")
        if route in self.files:
            return str(self.files[route])
        return super().translate_path(path)

    def end_headers(self) -> None:
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def send_head(self):
        """GET/HEAD of a file; a single `Range: bytes=A-[B]` gets 206 with those bytes (416 when
        it starts past the end). Other forms (several ranges, suffixes) get the whole file."""
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "").strip())
        path = self.translate_path(self.path)
        if match is None or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        start = int(match[1])
        end = min(int(match[2]) if match[2] else size - 1, size - 1)
        if start >= size or end < start:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        f = open(path, "rb")
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        self._remaining = end - start + 1
        return f

    def copyfile(self, source, outputfile) -> None:
        remaining = getattr(self, "_remaining", None)
        if remaining is None:
            return super().copyfile(source, outputfile)
        self._remaining = None
        while remaining > 0:
            block = source.read(min(remaining, 1 << 16))
            if not block:
                break
            outputfile.write(block)
            remaining -= len(block)

    def log_message(self, fmt, *args) -> None:
        if not self.quiet:
            super().log_message(fmt, *args)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def start(site: Path, port: int = 0, host: str = "127.0.0.1", quiet: bool = True,
          files: dict[str, Path] | None = None) -> tuple[Server, str]:
    """Serve `site` in a background thread, and each of `files` (URL path -> local file) at its
    URL path; returns (server, base URL). port 0 = a free port."""
    handler = functools.partial(type("Handler", (SiteHandler,), {"quiet": quiet,
                                                                 "files": dict(files or {})}),
                                directory=str(site))
    server = Server((host, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://localhost:{server.server_address[1]}/"
