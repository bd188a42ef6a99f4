"""A static file server for dist/site/: the right MIME types and cross-origin isolation headers.

WebAssembly must come as application/wasm (streaming compilation refuses anything else) and ES
modules as a JavaScript type. COOP same-origin + COEP require-corp make the page cross-origin
isolated (SharedArrayBuffer, precise timers), which is also a cheap proof that nothing from
another origin is embedded. The runtime does not need them: e2e runs the pages from a plain
http.server too (e2e/conftest.py's plain_site_url). `Cache-Control: no-cache` makes the browser revalidate, so a rebuilt
site is never mixed with a stale one (weights are cached in OPFS, not by HTTP).

Not here: building the site (site.py).
"""

from __future__ import annotations

import functools
import http.server
import socketserver
import threading
from pathlib import Path

MIME = {".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript",
        ".json": "application/json", ".html": "text/html; charset=utf-8",
        ".css": "text/css", ".gguf": "application/octet-stream", ".whl": "application/zip",
        ".zip": "application/zip", ".wgsl": "text/plain; charset=utf-8"}


class SiteHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, **MIME}
    quiet = True

    def end_headers(self) -> None:
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def log_message(self, fmt, *args) -> None:
        if not self.quiet:
            super().log_message(fmt, *args)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def start(site: Path, port: int = 0, host: str = "127.0.0.1", quiet: bool = True
          ) -> tuple[Server, str]:
    """Serve `site` in a background thread; returns (server, base URL). port 0 = a free port."""
    handler = functools.partial(type("Handler", (SiteHandler,), {"quiet": quiet}),
                                directory=str(site))
    server = Server((host, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://localhost:{server.server_address[1]}/"
