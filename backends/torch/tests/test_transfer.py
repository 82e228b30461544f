"""loops_worker.transfer: checkpoint files through presigned URLs, against a local HTTP server
that stores PUT bodies and serves them back (as S3 does for presigned URLs)."""

import hashlib
import http.server
import os
import threading

import pytest

from loops_worker import transfer
from loops_worker.confine import Confinement
from loops_worker.errors import FAILED_PRECONDITION, INVALID_ARGUMENT, WorkerError
from loops_worker.proto import bpb


class _Objects(http.server.BaseHTTPRequestHandler):
    store: dict = {}
    gets: list = []
    redirects: dict = {}  # path -> Location

    def do_PUT(self):  # noqa: N802
        n = int(self.headers["Content-Length"])
        self.store[self.path] = self.rfile.read(n)
        self.send_response(200)
        self.end_headers()

    def do_GET(self):  # noqa: N802
        self.gets.append(self.path)
        if self.path in self.redirects:
            self.send_response(302)
            self.send_header("Location", self.redirects[self.path])
            self.end_headers()
            return
        body = self.store.get(self.path)
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _Objects.store, _Objects.gets, _Objects.redirects = {}, [], {}
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Objects)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


@pytest.fixture
def store(server):
    """The confinement of a worker whose checkpoint store is the test server."""
    return Confinement(origins=[server])


def _file(base, name, body):
    _Objects.store["/" + name] = body
    return bpb.FileURL(name=name, url=f"{base}/{name}", size=len(body), sha256=hashlib.sha256(body).hexdigest())


def test_upload_then_download_round_trip(server, store, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "adapter_model.safetensors").write_bytes(os.urandom(3 << 20))
    (src / "sub" / "b.json").write_bytes(b"{}")
    urls = [bpb.FileURL(name=n, url=f"{server}/{n}") for n in ("adapter_model.safetensors", "sub/b.json", "unused.bin")]
    files = transfer.upload(str(src), urls, store)
    assert sorted(f.name for f in files) == ["adapter_model.safetensors", "sub/b.json"]
    for f in files:
        body = (src / f.name).read_bytes()
        assert _Objects.store["/" + f.name] == body
        assert f.size == len(body) and f.sha256 == hashlib.sha256(body).hexdigest()
    for f in files:
        f.url = f"{server}/{f.name}"
    dest = tmp_path / "dest"
    transfer.download(files, str(dest), store)
    assert (dest / "adapter_model.safetensors").read_bytes() == (src / "adapter_model.safetensors").read_bytes()
    assert (dest / "sub" / "b.json").read_bytes() == b"{}"


def test_upload_refuses_a_file_without_a_url(server, store, tmp_path):
    (tmp_path / "a").write_bytes(b"x")
    with pytest.raises(WorkerError) as e:
        transfer.upload(str(tmp_path), [bpb.FileURL(name="b", url=f"{server}/b")], store)
    assert e.value.code == FAILED_PRECONDITION and "no upload URL" in e.value.message


@pytest.mark.parametrize("case", ["short", "long", "hash", "missing"])
def test_download_checks_size_and_hash_and_leaves_nothing(server, store, tmp_path, case):
    good = _file(server, "w", b"0123456789")
    bad = bpb.FileURL()
    bad.CopyFrom(good)
    if case == "short":
        bad.size = 11
    elif case == "long":
        bad.size = 9
    elif case == "hash":
        bad.sha256 = hashlib.sha256(b"other").hexdigest()
    else:
        bad.url = f"{server}/nothing"
    with pytest.raises(WorkerError) as e:
        transfer.download([bad], str(tmp_path / "d"), store)
    assert e.value.code in (FAILED_PRECONDITION, transfer.UNAVAILABLE)
    assert not (tmp_path / "d").exists()
    assert os.listdir(tmp_path) == [], "no temporary folder left"


@pytest.mark.parametrize("name", ["../x", "/abs", "a/../b", "", "a//b", "a\\b"])
def test_download_refuses_names_that_leave_the_folder(server, store, tmp_path, name):
    f = _file(server, "w", b"x")
    f.name = name
    with pytest.raises(WorkerError) as e:
        transfer.download([f], str(tmp_path / "d"), store)
    assert e.value.code == INVALID_ARGUMENT


def test_download_refuses_a_checkpoint_over_the_cap_before_reading(server, store, tmp_path, monkeypatch):
    monkeypatch.setattr(transfer, "MAX_CHECKPOINT_BYTES", 5)
    with pytest.raises(WorkerError) as e:
        transfer.download([_file(server, "w", b"0123456789")], str(tmp_path / "d"), store)
    assert e.value.code == INVALID_ARGUMENT
    assert _Objects.gets == []


def test_adapter_cache_downloads_once_and_evicts_least_recently_used(server, store, tmp_path):
    cache = transfer.AdapterCache(str(tmp_path / "cache"), max_bytes=25, confine=store)
    a = [_file(server, "a", b"a" * 10)]
    b = [_file(server, "b", b"b" * 10)]
    c = [_file(server, "c", b"c" * 10)]
    da = cache.get(a)
    assert cache.get(a) == da
    assert _Objects.gets == ["/a"], "one download per content"
    db = cache.get(b)
    cache.get(a)  # a is now the most recently used
    dc = cache.get(c)
    assert os.path.isdir(da) and os.path.isdir(dc)
    assert not os.path.exists(db), "the least recently used adapter went past the bound"
    # New URLs for the same content (presigned again) hit the cache.
    a2 = [_file(server, "a2", b"a" * 10)]
    a2[0].name = "a"
    assert cache.get(a2) == da


def test_urls_only_of_the_checkpoint_store(server, store, tmp_path):
    """A URL of another origin, in a download, an upload or the adapter cache, is refused
    before anything is fetched; so is every URL when no store is configured."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(b"x")
    port = int(server.rsplit(":", 1)[1])
    for url in (f"http://localhost:{port}/w", f"https://127.0.0.1:{port}/w", "http://127.0.0.1:1/w", "file:///etc/passwd",
                f"http://user@127.0.0.1:{port}/w"):
        f = _file(server, "w", b"0123456789")
        f.url = url
        for call in (lambda: transfer.download([f], str(tmp_path / "d"), store),
                     lambda: transfer.upload(str(tmp_path / "src"), [bpb.FileURL(name="a", url=url)], store),
                     lambda: transfer.AdapterCache(str(tmp_path / "c"), 1 << 20, store).get([f])):
            with pytest.raises(WorkerError) as e:
                call()
            assert e.value.code == INVALID_ARGUMENT, url
    assert _Objects.gets == [] and "/a" not in _Objects.store
    with pytest.raises(WorkerError) as e:
        transfer.download([_file(server, "w", b"x")], str(tmp_path / "d"), Confinement())
    assert "--checkpoint-origin" in e.value.message


def test_redirects_only_within_the_checkpoint_store(server, store, tmp_path):
    """A redirect to the store's own origin is followed; one anywhere else is refused, and
    the other server is never asked."""
    body = b"0123456789"
    good = _file(server, "real", body)
    moved = bpb.FileURL(name="w", url=f"{server}/moved", size=len(body), sha256=good.sha256)
    _Objects.redirects["/moved"] = f"{server}/real"
    transfer.download([moved], str(tmp_path / "ok"), store)
    assert (tmp_path / "ok" / "w").read_bytes() == body
    hits = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            hits.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        _Objects.redirects["/moved"] = f"http://127.0.0.1:{other.server_address[1]}/stolen"
        with pytest.raises(WorkerError) as e:
            transfer.download([moved], str(tmp_path / "no"), store)
        assert e.value.code == INVALID_ARGUMENT and "redirect" in e.value.message
        assert hits == [] and not (tmp_path / "no").exists()
    finally:
        other.shutdown()
