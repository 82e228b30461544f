"""Checkpoint files as presigned URLs (loops.backend.v1 FileURL), for a worker that shares no
file system with the gateway: the gateway's checkpoint store (S3) hands out a presigned GET or
PUT URL per file, and the worker moves each file over HTTP(S) with the standard library.

Every URL, and every redirect a server answers with, must be of the checkpoint store (the
worker's Confinement: --checkpoint-origin); the servicers check the URLs of a request before
anything is fetched, and the opener here refuses a redirect anywhere else.

Downloads are bounded and verified: each file's name must be a plain relative path, its size
is capped before anything is read, the body is streamed to disk (never held in memory), and a
body longer or shorter than the size or with another SHA-256 fails the call. Uploads stream
each file from disk while hashing it, and report each file's size and SHA-256, which the
gateway commits in the checkpoint's manifest and checks on every later read.

AdapterCache keeps downloaded sampler adapters, one folder per content (the files' names and
hashes), removing the least recently used ones beyond a byte bound.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import posixpath
import shutil
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections import OrderedDict

from .errors import FAILED_PRECONDITION, INVALID_ARGUMENT, UNAVAILABLE, WorkerError

# Caps on what a download trusts (the gateway's checkpoint store has the same file count cap).
MAX_FILES = 4096
MAX_CHECKPOINT_BYTES = int(os.environ.get("LOOPS_WORKER_MAX_CHECKPOINT_BYTES", str(64 << 30)))
# Network timeout of one request (seconds without progress, as urllib applies it per read).
TIMEOUT_S = float(os.environ.get("LOOPS_WORKER_TRANSFER_TIMEOUT_S", "60"))
CHUNK = 1 << 20


def _check_name(name: str) -> str:
    if not name or len(name) > 255 or name.startswith("/") or "\\" in name or "\x00" in name:
        raise WorkerError(INVALID_ARGUMENT, f"checkpoint file name {name!r} is not a plain relative path")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise WorkerError(INVALID_ARGUMENT, f"checkpoint file name {name!r} is not a plain relative path")
    return posixpath.normpath(name)


def _check_files(files) -> int:
    if not files or len(files) > MAX_FILES:
        raise WorkerError(INVALID_ARGUMENT, f"a checkpoint has 1 to {MAX_FILES} files, got {len(files)}")
    total, seen = 0, set()
    for f in files:
        _check_name(f.name)
        if f.name in seen:
            raise WorkerError(INVALID_ARGUMENT, f"checkpoint file {f.name!r} is listed twice")
        seen.add(f.name)
        if f.size < 0 or len(f.sha256) != 64:
            raise WorkerError(INVALID_ARGUMENT, f"checkpoint file {f.name!r} needs a size and a SHA-256")
        total += f.size
    if total > MAX_CHECKPOINT_BYTES:
        raise WorkerError(INVALID_ARGUMENT, f"checkpoint of {total} bytes is over the worker's {MAX_CHECKPOINT_BYTES}-byte limit")
    return total


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to the checkpoint store."""

    def __init__(self, confine):
        super().__init__()
        self.confine = confine

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        self.confine.url("a redirect of the checkpoint store", urllib.parse.urljoin(req.full_url, newurl))
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _opener(confine):
    return urllib.request.build_opener(_Redirects(confine))


def download(files, dest: str, confine) -> None:
    """Downloads files (FileURL with url, size, sha256) into dest, which must not exist;
    dest appears only when every file arrived whole and verified. Every URL must be of
    confine's checkpoint store."""
    _check_files(files)
    confine.files("download", files)
    opener = _opener(confine)
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".download-", dir=parent)
    try:
        for f in files:
            path = os.path.join(tmp, *f.name.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            _get(opener, f, path)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _get(opener, f, path: str) -> None:
    h, n = hashlib.sha256(), 0
    try:
        with opener.open(f.url, timeout=TIMEOUT_S) as resp, open(path, "wb") as out:
            while True:
                chunk = resp.read(min(CHUNK, f.size - n + 1))
                if not chunk:
                    break
                n += len(chunk)
                if n > f.size:
                    raise WorkerError(FAILED_PRECONDITION, f"checkpoint file {f.name!r} is longer than its {f.size} bytes")
                h.update(chunk)
                out.write(chunk)
    except urllib.error.HTTPError as e:
        raise WorkerError(UNAVAILABLE, f"downloading checkpoint file {f.name!r}: HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        if isinstance(e, WorkerError):
            raise
        raise WorkerError(UNAVAILABLE, f"downloading checkpoint file {f.name!r}: {e}") from None
    if n != f.size:
        raise WorkerError(FAILED_PRECONDITION, f"checkpoint file {f.name!r} is {n} bytes, expected {f.size}")
    if h.hexdigest() != f.sha256:
        raise WorkerError(FAILED_PRECONDITION, f"checkpoint file {f.name!r} does not match its SHA-256")


class _HashingReader:
    """Reads a file for an upload, hashing what it reads."""

    def __init__(self, fh):
        self.fh, self.h, self.n = fh, hashlib.sha256(), 0

    def read(self, size=-1):
        b = self.fh.read(CHUNK if size is None or size < 0 else size)
        self.h.update(b)
        self.n += len(b)
        return b


def upload(src: str, urls, confine) -> list:
    """PUTs every regular file under src to the URL of its name (urls: FileURL with name and
    url, of confine's checkpoint store) and returns FileURL entries (name, size, sha256) of
    what it uploaded."""
    from .proto import bpb

    confine.files("upload", urls)
    opener = _opener(confine)
    by_name = {}
    for u in urls:
        by_name[_check_name(u.name)] = u.url
    out = []
    for root, dirs, names in os.walk(src):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src).replace(os.sep, "/")
            if os.path.islink(path) or not os.path.isfile(path):
                raise WorkerError(INVALID_ARGUMENT, f"checkpoint file {rel!r} is not a regular file")
            url = by_name.get(rel)
            if url is None:
                raise WorkerError(FAILED_PRECONDITION, f"the worker wrote {rel!r}, which the gateway gave no upload URL for")
            size = os.path.getsize(path)
            with open(path, "rb") as fh:
                body = _HashingReader(fh)
                req = urllib.request.Request(url, data=body, method="PUT",
                                             headers={"Content-Length": str(size), "Content-Type": "application/octet-stream"})
                try:
                    with opener.open(req, timeout=TIMEOUT_S) as resp:
                        resp.read()
                except urllib.error.HTTPError as e:
                    raise WorkerError(UNAVAILABLE, f"uploading checkpoint file {rel!r}: HTTP {e.code}") from None
                except (urllib.error.URLError, OSError) as e:
                    raise WorkerError(UNAVAILABLE, f"uploading checkpoint file {rel!r}: {e}") from None
            if body.n != size:
                raise WorkerError(FAILED_PRECONDITION, f"checkpoint file {rel!r} changed while it was uploaded")
            out.append(bpb.FileURL(name=rel, size=size, sha256=body.h.hexdigest()))
    if not out:
        raise WorkerError(FAILED_PRECONDITION, "the adapter save wrote no files")
    return out


class AdapterCache:
    """Sampler adapters downloaded from URLs: one folder per content under root, the least
    recently used removed once the folders exceed max_bytes (the one just returned stays)."""

    def __init__(self, root: str, max_bytes: int, confine):
        self.root, self.max_bytes, self.confine = root, max_bytes, confine
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root, exist_ok=True)
        atexit.register(shutil.rmtree, root, True)
        self.lock = threading.Lock()
        self.entries: OrderedDict[str, int] = OrderedDict()  # folder -> bytes
        self.fetching: dict[str, threading.Lock] = {}

    def get(self, files) -> str:
        total = _check_files(files)
        self.confine.files("adapter_files", files)
        ident = hashlib.sha256("\n".join(sorted(f"{f.name}\x00{f.sha256}" for f in files)).encode()).hexdigest()[:32]
        path = os.path.join(self.root, ident)
        with self.lock:
            if ident in self.entries:
                self.entries.move_to_end(ident)
                return path
            one = self.fetching.setdefault(ident, threading.Lock())
        with one:  # concurrent requests for one adapter download it once
            with self.lock:
                if ident in self.entries:
                    self.entries.move_to_end(ident)
                    return path
            try:
                download(files, path, self.confine)
            finally:
                with self.lock:
                    self.fetching.pop(ident, None)
            with self.lock:
                self.entries[ident] = total
                self._evict(keep=ident)
        return path

    def _evict(self, keep: str) -> None:
        while sum(self.entries.values()) > self.max_bytes and len(self.entries) > 1:
            oldest = next(iter(self.entries))
            if oldest == keep:
                self.entries.move_to_end(oldest)
                continue
            self.entries.pop(oldest)
            shutil.rmtree(os.path.join(self.root, oldest), ignore_errors=True)
