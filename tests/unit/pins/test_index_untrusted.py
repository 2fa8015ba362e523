"""What a package index page says is upstream text: `pins add`, `ci resolve` and every download read it through
a real loopback server here that serves hostile link texts, malformed PEP 691 JSON, trickling pages and
hostile requirement lines, and each is refused with a clear error and its exit code: nothing is written outside
the cache, no value that could carry code is pinned, no read outlives its deadline, no traceback."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import shutil
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.yamltext import yaml_text

from g4build.errors import ConfigError, UsageError
from g4build.pins import index
from g4build.pins.model import load_pins

REPO = Path(__file__).resolve().parents[3]
VERSION = "9.9.0"
SDIST = f"vllm-{VERSION}.tar.gz"


def sdist(requirements: str = "torch==2.11.0\nflashinfer-python==0.6.8.post1\n", cuda: str = "13.0.1") -> bytes:
    buf = io.BytesIO()
    members = {
        "vllm/_version.py": f"__version__ = version = '{VERSION}'\n__commit_id__ = commit_id = 'g{'ab' * 20}'\n",
        "requirements/cuda.txt": requirements,
        "docker/versions.json": json.dumps({"variable": {"CUDA_VERSION": {"default": cuda}}}),
    }
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{VERSION}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class Server:
    """A loopback index whose project page is whatever the test sets (``page``, ``ctype``), optionally sent a
    byte at a time every ``trickle`` seconds; files under /files/."""

    page: bytes = b""
    ctype: str = "application/vnd.pypi.simple.v1+json"
    trickle: float = 0.0
    files: dict[str, bytes] = field(default_factory=dict)
    url: str = ""
    stop: threading.Event = field(default_factory=threading.Event)

    def json_page(self, entries: list[dict[str, object]] | object) -> None:
        self.page = json.dumps({"meta": {"api-version": "1.1"}, "name": "vllm", "files": entries}
                               if isinstance(entries, list) else entries).encode()
        self.ctype = "application/vnd.pypi.simple.v1+json"

    def html_page(self, links: list[tuple[str, str]]) -> None:
        body = "".join(f'<a href="{href}">{text}</a><br/>\n' for text, href in links)
        self.page = f"<!DOCTYPE html><html><body>\n{body}</body></html>\n".encode()
        self.ctype = "text/html"


def _handler(srv: Server) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.startswith("/simple/"):
                self.send_response(200)
                self.send_header("Content-Type", srv.ctype)
                self.send_header("Content-Length", str(len(srv.page)))
                self.end_headers()
                if not srv.trickle:
                    self.wfile.write(srv.page)
                    return
                for byte in srv.page:
                    if srv.stop.wait(srv.trickle):
                        return
                    try:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                    except OSError:
                        return
                return
            name = self.path.rsplit("/", 1)[-1]
            if name in srv.files:
                body = srv.files[name]
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(404)
            self.end_headers()

    return Handler


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Server]:
    srv = Server()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(srv))
    httpd.daemon_threads = True
    srv.url = f"http://127.0.0.1:{httpd.server_address[1]}/simple"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    monkeypatch.setenv("PIP_INDEX_URL", srv.url)
    monkeypatch.setenv("G4BUILD_CACHE", str(tmp_path / "cache"))
    try:
        yield srv
    finally:
        srv.stop.set()
        httpd.shutdown()
        httpd.server_close()


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "patches").mkdir(parents=True)
    shutil.copy(REPO / "patches" / "pins.yaml", root / "patches" / "pins.yaml")
    shutil.copy(REPO / "patches" / "series.yaml", root / "patches" / "series.yaml")
    return root


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def g4(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> object:
    """The real CLI, in this process (a subprocess per case would cost a second each)."""
    from g4build.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("G4BUILD_PLAIN", "1")

    def run(*args: str, **env: str) -> Ran:
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            capsys.readouterr()
            try:
                main(list(args))
                code = 0
            except SystemExit as exc:
                code = int(exc.code or 0)
            out = capsys.readouterr()
        return Ran(code, out.out, out.err)

    return run


def _clean(proc: Ran, *codes: int) -> None:
    assert proc.returncode in codes, proc.stderr
    assert "Traceback" not in proc.stderr and "unexpected" not in proc.stderr.lower(), proc.stderr


# --- 2: link texts that name a path -------------------------------------------------------------------------

HOSTILE_NAMES = [
    "../../victim/vllm-9.9.0.tar.gz",
    "..&#47;..&#47;victim&#47;vllm-9.9.0.tar.gz",  # HTML entities for '/': decoded before the check
    "..\\..\\victim\\vllm-9.9.0.tar.gz",
    "/abs/victim/vllm-9.9.0.tar.gz",
    "C:vllm-9.9.0.tar.gz",
    "%2e%2e%2fvllm-9.9.0.tar.gz",  # URL-encoding is not decoded in a name: it stays a '%' name, refused
    "\uff0e\uff0e\uff0fvllm-9.9.0.tar.gz",  # fullwidth dots and solidus
    "vllm-9.9.0.tar.gz\nx",
    "vllm-9.9.0.tar.gz\u202e",  # a bidi override
    "vllm-9.9.0\x00.tar.gz",
]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
@pytest.mark.parametrize("form", ["html", "json"])
def test_pins_add_never_writes_where_a_link_text_points(g4: Any, tmp_path: Path, server: Server, name: str,
                                                        form: str) -> None:
    body = sdist()
    server.files[SDIST] = body
    sha = hashlib.sha256(body).hexdigest()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / SDIST).write_bytes(b"precious")
    # the cache sits two folders below tmp_path: ../../victim from cache/sdists is tmp_path/victim
    if form == "html":
        server.html_page([(name, f"/files/{SDIST}#sha256={sha}")])
    else:
        decoded = name.replace("&#47;", "/")
        server.json_page([{"filename": decoded, "url": f"/files/{SDIST}", "hashes": {"sha256": sha}}])
    root = _project(tmp_path)
    before = (root / "patches" / "pins.yaml").read_bytes()
    proc = g4("--root", str(root), "pins", "add", "--release", VERSION)
    _clean(proc, 5)
    assert "set aside as unsafe" in proc.stderr
    assert (victim / SDIST).read_bytes() == b"precious"
    assert sorted(p.name for p in victim.iterdir()) == [SDIST]  # no .lock beside it either
    assert (root / "patches" / "pins.yaml").read_bytes() == before
    everything = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")}
    assert {p for p in everything if not p.startswith(("cache", "project", "victim"))} == set()


def test_a_safe_page_still_pins(g4: Any, tmp_path: Path, server: Server) -> None:
    """The same server and sdist with a plain link text: `pins add` works (the cases above fail for the name)."""
    body = sdist()
    server.files[SDIST] = body
    server.html_page([(SDIST, f"/files/{SDIST}#sha256={hashlib.sha256(body).hexdigest()}")])
    root = _project(tmp_path)
    proc = g4("--root", str(root), "pins", "add", "--release", VERSION, "--json")
    _clean(proc, 0)
    pin = json.loads(proc.stdout)["pin"]
    assert (pin["torch"], pin["flashinfer"], pin["cuda"]) == ("2.11.0", "0.6.8.post1", "13.0")


def test_fetch_verified_refuses_a_name_that_leaves_its_folder(tmp_path: Path) -> None:
    for name in ("../x.tar.gz", "a/b.tar.gz", "..", "a\\b", "x\ny"):
        with pytest.raises(UsageError, match="not a file name"):
            index.fetch_verified("vllm", name, "0" * 64, cache_dir=tmp_path / "c")
    assert not (tmp_path / "c").exists()


# --- 3: pinned values that could become code ---------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "torch==2.14.0'+__import__('os').system('touch pwned')+'",
    'torch==2.14.0"',
    "torch==2.14.0$(touch pwned)",
    "torch==2.14.0`touch pwned`",
    "torch==v2.14.0/../..",
])
def test_a_hostile_requirement_is_not_pinned(g4: Any, tmp_path: Path, server: Server, line: str) -> None:
    body = sdist(requirements=f"{line}\nflashinfer-python==0.6.8.post1\n")
    server.files[SDIST] = body
    server.json_page([{"filename": SDIST, "url": f"/files/{SDIST}",
                       "hashes": {"sha256": hashlib.sha256(body).hexdigest()}}])
    root = _project(tmp_path)
    before = (root / "patches" / "pins.yaml").read_bytes()
    proc = g4("--root", str(root), "pins", "add", "--release", VERSION)
    _clean(proc, 2)
    assert "cannot read torch" in proc.stderr and "--torch" in proc.stderr
    assert (root / "patches" / "pins.yaml").read_bytes() == before
    # the user's own value is typed the same way
    bad = g4("--root", str(root), "pins", "add", "--release", VERSION,
                   "--torch", "2.14.0'+__import__('os')+'")
    _clean(bad, 2)
    assert "--torch" in bad.stderr
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(("key", "value"), [
    ("torch", "2.14.0'+__import__('os').system('x')+'"),
    ("torch", " 2.14.0"),
    ("torch", "2.14.0\n"),
    ("flashinfer", "0.6.8; rm -rf ~"),
    ("cuda", "13.0'"),
    ("cuda", "13"),
    ("version", "0.21.0\u2028"),
])
def test_the_pins_loader_types_every_version(tmp_path: Path, key: str, value: str) -> None:
    data = yaml.safe_load((REPO / "patches" / "pins.yaml").read_text(encoding="utf-8"))
    data["pins"]["vllm-0.21.0"][key] = value
    path = tmp_path / "pins.yaml"
    path.write_text(yaml_text(data), encoding="utf-8")
    with pytest.raises(ConfigError, match=f"{key}: not a version"):
        load_pins(path)


@pytest.mark.parametrize("remote", ["--upload-pack=touch pwned", "ext::sh -c touch% pwned", "https://x/y z",
                                    "https://x/y\n", "'https://x'"])
def test_the_pins_loader_types_remotes(tmp_path: Path, remote: str) -> None:
    data = yaml.safe_load((REPO / "patches" / "pins.yaml").read_text(encoding="utf-8"))
    data["pins"]["vllm-0.21.0"]["upstream"]["remote"] = remote
    path = tmp_path / "pins.yaml"
    path.write_text(yaml_text(data), encoding="utf-8")
    with pytest.raises(ConfigError, match="expected a git URL or path"):
        load_pins(path)


# --- 6: malformed PEP 691 pages -------------------------------------------------------------------------------

MALFORMED = {
    "a list at the top": b"[1, 2]",
    "files not a list": b'{"files": {"a": 1}}',
    "no files key": b'{"meta": {}}',
    "not JSON": b"{'files': ",
    "deep nesting": b"[" * 100000 + b"]" * 100000,
    "a string at the top": b'"files"',
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_json_page_is_a_download_error(g4: Any, tmp_path: Path, server: Server, case: str) -> None:
    server.page = MALFORMED[case]
    root = _project(tmp_path)
    _clean(g4("--root", str(root), "pins", "add", "--release", VERSION), 5)
    _clean(g4("ci", "resolve"), 5)


@pytest.mark.parametrize("entry", [
    1, None, "vllm-9.9.0.tar.gz", [],
    {"filename": 5, "url": "/files/x"},
    {"url": "/files/x"},
    {"filename": SDIST},
    {"filename": SDIST, "url": ["/files/x"]},
    {"filename": SDIST, "url": "/files/x", "hashes": ["sha256"]},
    {"filename": SDIST, "url": "/files/x", "hashes": {"sha256": 12}},
    {"filename": SDIST, "url": "/files/x", "hashes": {"sha256": "zz"}},
    {"filename": SDIST, "url": "file:///etc/passwd", "hashes": {"sha256": "a" * 64}},
    {"filename": SDIST, "url": "javascript:alert(1)", "hashes": {"sha256": "a" * 64}},
])
def test_a_malformed_entry_is_set_aside_not_a_traceback(g4: Any, tmp_path: Path, server: Server, entry: object) -> None:
    server.json_page([entry])
    root = _project(tmp_path)
    proc = g4("--root", str(root), "pins", "add", "--release", VERSION)
    _clean(proc, 4, 5)  # 4: an entry whose hashes are no mapping publishes no sha256
    assert "vllm-9.9.0.tar.gz" in proc.stderr or "no sdist of vllm 9.9.0" in proc.stderr


def test_odd_but_harmless_fields_are_tolerated(server: Server) -> None:
    server.json_page([{"filename": SDIST, "url": f"/files/{SDIST}", "hashes": {"sha256": "A" * 64},
                       "size": "12", "yanked": {"why": 1}}])
    (f,) = index.project_files("vllm")
    assert (f.filename, f.sha256, f.size, f.yanked) == (SDIST, "a" * 64, None, False)
    assert f.url == f"{server.url.rsplit('/', 1)[0]}/files/{SDIST}"


# --- 5: trickling pages ---------------------------------------------------------------------------------------

def test_a_trickling_page_ends_within_the_page_deadline(g4: Any, tmp_path: Path, server: Server) -> None:
    server.json_page([{"filename": SDIST, "url": f"/files/{SDIST}", "hashes": {"sha256": "a" * 64}}])
    server.trickle = 0.2  # a byte every 0.2 s: each read succeeds, the page would take minutes
    root = _project(tmp_path)
    for args in (("--root", str(root), "pins", "add", "--release", VERSION), ("ci", "resolve"),
                 ("patches", "check", "--release", VERSION)):
        start = time.monotonic()
        proc = g4(*args, G4BUILD_PAGE_DEADLINE="2")
        took = time.monotonic() - start
        _clean(proc, 5)
        assert "did not arrive within 2 s" in proc.stderr and "G4BUILD_PAGE_DEADLINE" in proc.stderr
        assert took < 30, took


def test_a_page_deadline_that_is_no_number_is_a_usage_error(g4: Any, tmp_path: Path, server: Server) -> None:
    proc = g4("ci", "resolve", G4BUILD_PAGE_DEADLINE="soon")
    _clean(proc, 2)
    assert "G4BUILD_PAGE_DEADLINE" in proc.stderr
