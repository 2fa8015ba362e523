"""A real package index on loopback for tests: PEP 691 JSON pages plus the files, served by http.server.

Serves whatever files a test registers, counts requests per path, and can cut a download short to
simulate an interrupted transfer.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class LocalIndex:
    url: str = ""
    files: dict[str, bytes] = field(default_factory=dict)  # filename -> bytes served
    published: dict[str, str] = field(default_factory=dict)  # filename -> sha256 the page publishes
    hits: Counter[str] = field(default_factory=Counter)
    cut_after: dict[str, int] = field(default_factory=dict)  # filename -> bytes sent before the connection drops

    def add(self, path: Path | str, data: bytes | None = None, *, publish_sha256: str | None = None) -> None:
        name = Path(path).name
        body = data if data is not None else Path(path).read_bytes()
        self.files[name] = body
        self.published[name] = publish_sha256 or hashlib.sha256(body).hexdigest()


def _handler(index: LocalIndex) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            index.hits[self.path] += 1
            if self.path.startswith("/simple/") and self.path.endswith("/"):
                files = [
                    {"filename": n, "url": f"/files/{n}", "hashes": {"sha256": index.published[n]}, "size": len(b)}
                    for n, b in index.files.items()
                ]
                body = json.dumps({"meta": {"api-version": "1.1"}, "name": "vllm", "files": files}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            name = self.path.rsplit("/", 1)[-1]
            if self.path.startswith("/files/") and name in index.files:
                body = index.files[name]
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                cut = index.cut_after.get(name)
                self.wfile.write(body if cut is None else body[:cut])
                return
            self.send_response(404)
            self.end_headers()

    return Handler


@contextmanager
def serve_index() -> Iterator[LocalIndex]:
    index = LocalIndex()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(index))
    index.url = f"http://127.0.0.1:{server.server_address[1]}/simple"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield index
    finally:
        server.shutdown()
        server.server_close()
