"""Sharded training: one replica of N ranks (torch.distributed) behind one endpoint.

A worker started with --world-size N is rank 0: it starts ranks 1..N-1 as child processes
(the same command with --rank r), they rendezvous over torch.distributed (gloo on CPU,
NCCL for tensors on GPU with gloo beside it for the commands), and rank 0 alone serves
loops.backend.v1. Every command that changes the replica's state is broadcast by rank 0
and applied by every rank in the one order rank 0's lock gives (Leader, follow):

- The frozen base is sharded with FSDP2 (torch.distributed.fsdp.fully_shard): each decoder
  layer is one FSDP unit, gathered for its forward and again for its backward, then freed;
  the rest of the decoder stack (embedding, final norm) is the root unit. The output head
  stays whole on every rank (it is called apart from the stack, in chunks over time); on a
  model with tied embeddings it becomes a copy of the embedding matrix.
- LoRA parameters, their gradients and their Adam moments are replicated: forward_backward
  splits the batch's rows across the ranks, each rank backpropagates its rows, and the new
  LoRA gradients are summed over the ranks (one all-reduce per group of rows) before they are
  added to what the adapter had accumulated, so every rank holds the gradient the 1-rank
  replica holds; optim_step then runs the same AdamW on every rank with no communication,
  and save is rank 0's alone (the same PEFT folder a single rank writes).
- A rank that dies ends the replica: rank 0 exits non-zero when a follower exits, and a
  follower exits when rank 0 does (its stdin, a pipe from rank 0, closes), so the gateway
  sees the replica lost and its step recovery rebuilds it.

- Sampling (the transformers sampler, sampler.HFSampler with the Leader as its lockstep):
  a sample holds rank 0's command order for its whole run, and before each of its forward
  passes rank 0 broadcasts a "sample_pass" command naming the base model. Every other rank
  then runs a one-token pass of that model whose output it drops: the pass exists only so
  that each layer's FSDP all-gather finds every rank. Rank 0 runs the real pass (the
  prompt, the KV cache, the adapter), draws the tokens and answers alone. This is data
  parallelism's sharded storage, not tensor parallelism: each pass's compute is rank 0's
  alone, and the base's memory is what is split. The GPU path for sampler pools is vLLM's
  tensor parallelism (vllm_sampler.py), not this.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from .errors import WorkerError

log = logging.getLogger("loops_worker")

MAX_WORLD_SIZE = 64  # pools.MaxGPUsPerReplica
# A folder a load ships to the other ranks: the files of one checked adapter folder.
_MAX_LOAD_FILES = 16
_FAULTS = os.environ.get("LOOPS_WORKER_TEST_FAULTS") == "1"
# The longest rank 0 lets the others wait for a command (Leader._ping), well under the
# process group's collective timeout (init's timeout_s).
KEEPALIVE_S = 60.0


class Dist:
    """This process's place in the replica's process group."""

    def __init__(self, rank: int, world: int, device: torch.device):
        self.rank = rank
        self.world = world
        self.device = device
        self.mesh = None

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def span(self, n: int) -> range:
        """The rows of n (in order) this rank computes: a contiguous share, the first
        n % world ranks one row more."""
        q, r = divmod(n, self.world)
        lo = self.rank * q + min(self.rank, r)
        return range(lo, lo + q + (1 if self.rank < r else 0))

    def broadcast(self, obj=None):
        """Rank 0's obj on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj) -> Optional[List]:
        """Every rank's obj, in rank order, on rank 0 (None elsewhere)."""
        out = [None] * self.world if self.leader else None
        dist.gather_object(obj, out, dst=0)
        return out

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t


def init(rank: int, world: int, init_method: str, device: torch.device, timeout_s: float = 1800) -> Dist:
    """Joins the replica's process group (every rank calls it) and makes its device mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL and the mesh use the current device
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    d = Dist(rank, world, device)
    d.mesh = init_device_mesh(device.type, (world,))
    return d


def shard_model(bm, d: Dist) -> None:
    """Shards bm's frozen base over d's ranks with FSDP2 (module doc), pads its passes (one
    pass per group of rows on every rank, so the ranks' collectives match) and makes every
    training pass's hidden states need a gradient (so every rank's backward goes through
    every layer, gathering each as the others do, whatever its rows' adapters train)."""
    from torch.distributed.fsdp import fully_shard

    from .lora import MultiLoraLinear

    inner = getattr(bm.model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise ValueError(f"{bm.name}: {type(bm.model).__name__} has no decoder layer list (model.model.layers); "
                         f"it cannot be sharded: serve it with --world-size 1")
    head = bm.model.lm_head
    lin = head.base if isinstance(head, MultiLoraLinear) else head
    if bm.tied:
        # the head keeps a whole copy; the embedding matrix is sharded with the stack
        lin.weight = nn.Parameter(lin.weight.detach().clone(), requires_grad=False)
    for layer in layers:
        fully_shard(layer, mesh=d.mesh)
    fully_shard(inner, mesh=d.mesh)
    anchor = torch.zeros((), dtype=bm.dtype, device=bm.device, requires_grad=True)

    def grad_anchor(_m, _i, out):
        return out + anchor if torch.is_grad_enabled() and torch.is_tensor(out) else out

    bm.model.get_input_embeddings().register_forward_hook(grad_anchor)
    bm.anchor = anchor
    bm.dist = d
    bm.pad = True


def sampler(leader: "Leader"):
    """The sampler of a multi-rank replica: the transformers sampler over rank 0's engine,
    every forward pass run by every rank (module doc)."""
    from .sampler import HFSampler

    return HFSampler(leader, lockstep=leader)


def refuse_vllm(world: int) -> ValueError:
    return ValueError(f"--sampler vllm does not run in a {world}-rank training replica (--world-size {world}): "
                      f"its sampling is the transformers sampler over the sharded base; for vLLM give the model "
                      f"sampler replicas (sampler_replicas), whose vLLM is tensor-parallel over their GPUs")


@torch.no_grad()
def follow_pass(bm) -> None:
    """A follower's share of one of rank 0's sampling passes over bm: a one-token pass
    (output dropped) that joins each layer's all-gather (module doc)."""
    bm.ctx.segments = []
    ids = torch.zeros((1, 1), dtype=torch.long, device=bm.device)
    bm.model(input_ids=ids, use_cache=False, logits_to_keep=1)


# -- commands ------------------------------------------------------------------------------


def _parse(name: str, payload: bytes):
    from .proto import bpb

    types = {"create_adapter": bpb.CreateAdapterRequest, "forward_backward": bpb.ForwardBackwardRequest,
             "optim_step": bpb.OptimStepRequest, "load_adapter": bpb.LoadAdapterRequest}
    return types[name].FromString(payload)


def _read_folder(d: str) -> Dict[str, bytes]:
    """The regular files of an adapter folder rank 0 has just loaded (checked there)."""
    out: Dict[str, bytes] = {}
    with os.scandir(d) as it:
        for e in it:
            if e.is_file(follow_symlinks=False):
                if len(out) >= _MAX_LOAD_FILES:
                    raise ValueError(f"adapter folder {d} holds more than {_MAX_LOAD_FILES} files")
                with open(e.path, "rb") as f:
                    out[e.name] = f.read()
    return out


def apply(engine, name: str, payload, files: Optional[Dict[str, bytes]] = None):
    """Runs one command on this rank's engine."""
    if name == "delete_adapter":
        return engine.delete_adapter(payload)
    req = _parse(name, payload)
    if name == "load_adapter":
        with tempfile.TemporaryDirectory(prefix="loops-rank-load-") as tmp:
            for fn, data in (files or {}).items():
                with open(os.path.join(tmp, os.path.basename(fn)), "wb") as f:
                    f.write(data)
            req.dir = tmp
            return engine.load_adapter(req)
    return getattr(engine, name)(req)


class Leader:
    """Rank 0's engine: the server's Engine with every state change broadcast to the other
    ranks first (forward_backward, whose passes are collective) or after it succeeded here
    (the others: a refused request changes nothing anywhere). Other attributes are the
    Engine's."""

    def __init__(self, engine, d: Dist, keepalive_s: float = KEEPALIVE_S):
        self._e = engine
        self._d = d
        self._mu = threading.Lock()  # one command at a time: the order every rank applies
        self._last = time.monotonic()  # of the last command sent (under _mu)
        self._keepalive = keepalive_s
        self._closed = False
        threading.Thread(target=self._ping, name="rank0-keepalive", daemon=True).start()

    def _ping(self) -> None:
        """Sends a no-op command whenever none went for keepalive_s: the other ranks wait for
        the next command inside a collective, which times out (init's timeout_s) otherwise."""
        while True:
            time.sleep(self._keepalive / 2)
            with self._mu:
                if self._closed:
                    return
                if time.monotonic() - self._last >= self._keepalive:
                    self._send("ping", None)

    def __getattr__(self, name):
        return getattr(self._e, name)

    def _send(self, name: str, payload, files=None) -> None:
        try:
            self._d.broadcast((name, payload, files))
        except Exception:  # noqa: BLE001 - a rank is gone (its process or its node)
            log.exception("sending %s to the other %d ranks failed: the replica is lost; exiting", name, self._d.world - 1)
            logging.shutdown()
            os._exit(1)
        self._last = time.monotonic()

    def forward_backward(self, req):
        with self._mu:
            self._send("forward_backward", req.SerializeToString())
            try:
                return self._e.forward_backward(req)
            except WorkerError:
                raise  # refused on every rank alike (follow)
            except BaseException:  # noqa: BLE001 - the other ranks may be inside a collective
                log.exception("forward_backward failed on rank 0 of %d: the replica is lost; exiting", self._d.world)
                logging.shutdown()
                os._exit(1)

    def create_adapter(self, req):
        with self._mu:
            self._e.create_adapter(req)
            self._send("create_adapter", req.SerializeToString())

    def delete_adapter(self, adapter_id: str):
        with self._mu:
            self._e.delete_adapter(adapter_id)
            self._send("delete_adapter", adapter_id)

    def optim_step(self, req):
        with self._mu:
            out = self._e.optim_step(req)
            self._send("optim_step", req.SerializeToString())
            return out

    def load_adapter(self, req):
        with self._mu:
            self._e.load_adapter(req)
            self._send("load_adapter", req.SerializeToString(), _read_folder(req.dir))

    @contextlib.contextmanager
    def sampling(self):
        """Holds the replica's command order for one sample's passes (sample_pass)."""
        with self._mu:
            yield

    def sample_pass(self, model: str, run):
        """run(), one forward pass of base model model, with every other rank running its
        share (follow_pass); under sampling(). A pass that fails here may leave the other
        ranks inside a collective: the replica is lost."""
        self._send("sample_pass", model)
        try:
            return run()
        except BaseException:  # noqa: BLE001
            log.exception("a sampling pass failed on rank 0 of %d: the replica is lost; exiting", self._d.world)
            logging.shutdown()
            os._exit(1)

    def stop(self) -> None:
        """Tells the other ranks to exit (after the command in flight)."""
        with self._mu:
            self._send("exit", None)
            self._closed = True

    def close(self) -> None:
        """Sends nothing more (the caller ends the other ranks: Ranks.stop)."""
        with self._mu:
            self._closed = True


def setup(engine, d: Dist) -> None:
    """Shards every base model of engine over d (shard_model)."""
    for name in engine.order:
        shard_model(engine.models[name], d)
    engine.dist = d


def follow(engine, d: Dist) -> int:
    """A follower's loop: applies rank 0's commands until told to exit. A forward_backward
    that this rank refuses is refused on rank 0 too (same request, same state); any other
    failure means this rank's state left rank 0's, and the replica ends."""
    while True:
        name, payload, files = d.broadcast()
        if name == "exit":
            return 0
        if name == "ping":
            continue
        if name == "sample_pass":
            try:
                follow_pass(engine.models[payload])
            except Exception:  # noqa: BLE001 - this rank left the replica's collectives
                log.exception("rank %d: a sampling pass failed", d.rank)
                return 1
            continue
        if _FAULTS and name == "forward_backward" and any(it.adapter_id == "__rank_crash__" for it in _parse(name, payload).items):
            os._exit(17)  # a test fault: this rank dies in the middle of rank 0's step
        try:
            apply(engine, name, payload, files)
        except WorkerError as e:
            if name != "forward_backward":
                log.error("rank %d: %s failed here after it succeeded on rank 0: %s", d.rank, name, e.message)
                return 1
        except Exception:  # noqa: BLE001
            log.exception("rank %d: %s failed", d.rank, name)
            return 1


# -- processes -----------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on host now (for rank 0's torch.distributed store)."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Ranks:
    """Rank 0's children, ranks 1..N-1: started with the worker's own arguments plus
    --rank r --dist-init URL, their stdout sent to stderr (only rank 0 prints the listening
    line), their stdin a pipe whose closing tells them rank 0 is gone. A child that exits
    before stop() ends this process with status 1 (the replica is lost)."""

    def __init__(self, argv: List[str], world: int, init_method: str):
        self.closing = False
        self.procs: List[subprocess.Popen] = []
        for r in range(1, world):
            cmd = [sys.executable, "-m", "loops_worker", *argv, "--rank", str(r), "--dist-init", init_method]
            self.procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=sys.stderr.fileno()))
        for r, p in enumerate(self.procs, start=1):
            threading.Thread(target=self._watch, args=(r, p), name=f"rank-{r}", daemon=True).start()

    def _watch(self, r: int, p: subprocess.Popen) -> None:
        rc = p.wait()
        if not self.closing:
            log.error("rank %d exited with status %d: the replica is lost; exiting", r, rc)
            logging.shutdown()
            os._exit(1)

    def stop(self, timeout: float = 10.0) -> None:
        self.closing = True
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()


def exit_with_parent() -> None:
    """A follower: exits when rank 0 is gone (its stdin closes)."""

    def watch():
        try:
            sys.stdin.buffer.read()
        finally:
            os._exit(0)

    threading.Thread(target=watch, name="rank0-watch", daemon=True).start()
