"""loops_worker.confine: the folders and URLs a request may name (as backends/serve/confine.go)."""

import os

import pytest

from loops_worker.confine import Confinement
from loops_worker.errors import INVALID_ARGUMENT, WorkerError


def _refused(fn, *args):
    with pytest.raises(WorkerError) as e:
        fn(*args)
    assert e.value.code == INVALID_ARGUMENT
    return e.value.message


def test_folders_inside_the_allowed_ones_only(tmp_path):
    root, outside = tmp_path / "allowed", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("owner's")
    os.symlink(outside, root / "escape")
    (root / "planted").mkdir()
    os.symlink(outside / "secret", root / "planted" / "adapter_model.safetensors")
    (root / "fine").mkdir()
    os.symlink(root / "fine", root / "inner-link")
    c = Confinement([str(root)])
    c.dir("dir", str(root / "new" / "ck"))  # not there yet: a save makes it
    c.dir("dir", str(root / "inner-link"))  # a link that stays inside
    c.dir("dir", "")
    for bad in (str(outside / "ck"), "ck", f"{root}/../outside/ck", str(root / "escape" / "ck"), str(root / "planted"),
                f"{root}/x\x00y", "/" + "a/" * 3000):
        msg = _refused(c.dir, "dir", bad)
        assert str(outside) not in msg, "the error names no path"
    assert "--allow-dir" in _refused(Confinement().dir, "dir", str(root))


def test_urls_of_the_store_only():
    c = Confinement(origins=["https://store.example:9000", "http://10.0.0.5"])
    c.url("u", "https://store.example:9000/bucket/key?X-Amz-Signature=abc")
    c.url("u", "https://STORE.example:9000/b")
    c.url("u", "http://10.0.0.5/b")
    c.url("u", "http://10.0.0.5:80/b")
    for bad in ("https://store.example/b", "http://store.example:9000/b", "https://store.example:9001/b",
                "https://user:pw@store.example:9000/b", "https://evil.example/?https://store.example:9000",
                "https://store.example:9000@evil.example/b", "file:///etc/passwd", "ftp://10.0.0.5/x", "http://10.0.0.5:x/"):
        _refused(c.url, "u", bad)
    assert "--checkpoint-origin" in _refused(Confinement().url, "u", "https://store.example:9000/b")
    for bad in ("https://store.example/bucket", "ftp://h", "https://u@h", "h:9000"):
        with pytest.raises(ValueError):
            Confinement(origins=[bad])
    with pytest.raises(ValueError):
        Confinement(["relative"])


def test_credentials_from_the_environment_leave_no_key_behind(certs, monkeypatch):
    """The Ray driver's way: PEM text in the environment; the key is removed from it once
    read (no child process inherits it), and a key file others may read is refused."""
    from loops_worker import credentials

    monkeypatch.setenv(credentials.ENV_CERT, certs["wk"].decode())
    monkeypatch.setenv(credentials.ENV_KEY, certs["wk.key"].decode())
    monkeypatch.setenv(credentials.ENV_CA, certs["gwca"].decode())
    c = credentials.from_env()
    assert c is not None and c.key == certs["wk.key"]
    assert credentials.ENV_KEY not in os.environ
    assert "PRIVATE" not in repr(c)
    assert credentials.from_env() is None, "read once"


def test_key_files_others_may_read_are_refused(certs, tmp_path):
    from loops_worker import credentials

    paths = {}
    for name in ("wk", "wk.key", "gwca"):
        p = tmp_path / name
        p.write_bytes(certs[name])
        p.chmod(0o600)
        paths[name] = str(p)
    assert credentials.load(paths["wk"], paths["wk.key"], paths["gwca"]).cert == certs["wk"]
    os.chmod(paths["wk.key"], 0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        credentials.load(paths["wk"], paths["wk.key"], paths["gwca"])
    with pytest.raises(ValueError, match="mutual TLS only"):
        credentials.load("", "", "")


def test_worker_without_credentials_does_not_start(capsys):
    from loops_worker.__main__ import main

    assert main(["--model", "tiny", "--listen", "127.0.0.1:0"]) == 2
    assert "mutual TLS only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", "tiny", "--register", "http://127.0.0.1:1", "--pool", "p", "--join-token-file", "/x"])
