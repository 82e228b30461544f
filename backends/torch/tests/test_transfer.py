"""loops_worker.transfer: checkpoint files through presigned URLs, against a local HTTP server
that stores PUT bodies and serves them back (as S3 does for presigned URLs)."""

import hashlib
import http.server
import os
import threading

import pytest

from loops_worker import transfer
from loops_worker.errors import FAILED_PRECONDITION, INVALID_ARGUMENT, WorkerError
from loops_worker.proto import bpb


class _Objects(http.server.BaseHTTPRequestHandler):
    store: dict = {}
    gets: list = []

    def do_PUT(self):  # noqa: N802
        n = int(self.headers["Content-Length"])
        self.store[self.path] = self.rfile.read(n)
        self.send_response(200)
        self.end_headers()

    def do_GET(self):  # noqa: N802
        self.gets.append(self.path)
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
    _Objects.store, _Objects.gets = {}, []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Objects)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def _file(base, name, body):
    _Objects.store["/" + name] = body
    return bpb.FileURL(name=name, url=f"{base}/{name}", size=len(body), sha256=hashlib.sha256(body).hexdigest())


def test_upload_then_download_round_trip(server, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "adapter_model.safetensors").write_bytes(os.urandom(3 << 20))
    (src / "sub" / "b.json").write_bytes(b"{}")
    urls = [bpb.FileURL(name=n, url=f"{server}/{n}") for n in ("adapter_model.safetensors", "sub/b.json", "unused.bin")]
    files = transfer.upload(str(src), urls)
    assert sorted(f.name for f in files) == ["adapter_model.safetensors", "sub/b.json"]
    for f in files:
        body = (src / f.name).read_bytes()
        assert _Objects.store["/" + f.name] == body
        assert f.size == len(body) and f.sha256 == hashlib.sha256(body).hexdigest()
    for f in files:
        f.url = f"{server}/{f.name}"
    dest = tmp_path / "dest"
    transfer.download(files, str(dest))
    assert (dest / "adapter_model.safetensors").read_bytes() == (src / "adapter_model.safetensors").read_bytes()
    assert (dest / "sub" / "b.json").read_bytes() == b"{}"


def test_upload_refuses_a_file_without_a_url(server, tmp_path):
    (tmp_path / "a").write_bytes(b"x")
    with pytest.raises(WorkerError) as e:
        transfer.upload(str(tmp_path), [bpb.FileURL(name="b", url=f"{server}/b")])
    assert e.value.code == FAILED_PRECONDITION and "no upload URL" in e.value.message


@pytest.mark.parametrize("case", ["short", "long", "hash", "missing"])
def test_download_checks_size_and_hash_and_leaves_nothing(server, tmp_path, case):
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
        transfer.download([bad], str(tmp_path / "d"))
    assert e.value.code in (FAILED_PRECONDITION, transfer.UNAVAILABLE)
    assert not (tmp_path / "d").exists()
    assert os.listdir(tmp_path) == [], "no temporary folder left"


@pytest.mark.parametrize("name", ["../x", "/abs", "a/../b", "", "a//b", "a\\b"])
def test_download_refuses_names_that_leave_the_folder(server, tmp_path, name):
    f = _file(server, "w", b"x")
    f.name = name
    with pytest.raises(WorkerError) as e:
        transfer.download([f], str(tmp_path / "d"))
    assert e.value.code == INVALID_ARGUMENT


def test_download_refuses_a_checkpoint_over_the_cap_before_reading(server, tmp_path, monkeypatch):
    monkeypatch.setattr(transfer, "MAX_CHECKPOINT_BYTES", 5)
    with pytest.raises(WorkerError) as e:
        transfer.download([_file(server, "w", b"0123456789")], str(tmp_path / "d"))
    assert e.value.code == INVALID_ARGUMENT
    assert _Objects.gets == []


def test_adapter_cache_downloads_once_and_evicts_least_recently_used(server, tmp_path):
    cache = transfer.AdapterCache(str(tmp_path / "cache"), max_bytes=25)
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
