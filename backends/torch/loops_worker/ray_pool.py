"""python -m loops_worker.ray_pool --spec JSON: the pool driver, one Ray job per pool.

The gateway's ray provider (backends/pools/ray) submits it through the Ray Jobs API. It
follows the pool's desired size from the gateway (RegistryService.WatchPool over TLS,
authenticated by $LOOPS_JOIN_TOKEN) and keeps one worker actor per replica, each in a placement group of its
own (one bundle {CPU: 1, GPU: gpus_per_replica}, STRICT_PACK; Ray re-places the group when
its node dies). A sampler pool of gpus_per_replica = N > 1 is such an actor with N GPUs, its
vLLM tensor-parallel over them (--vllm-tensor-parallel-size N: vLLM's mp executor, one worker
process per GPU the actor sees); such a replica fits on one node. An actor serves the worker protocol in process (the same engine as
`python -m loops_worker`) and registers with the gateway as pool/replica; Ray restarts a dead
actor (max_restarts), and the restarted one registers as a new incarnation. Scaling down
kills the highest replicas' actors and removes their groups. When the gateway deletes the
pool (WatchPool ends with NOT_FOUND) the driver exits and Ray reclaims its actors.

An actor listens on spec["listen_host"] (127.0.0.1 unless the gateway was told otherwise:
a gateway on another host needs the actors reachable, which it must ask for), over mutual TLS
with the pool's credentials from the job's environment (LOOPS_WORKER_TLS_CERT, _KEY, _CA):
it answers only the gateway.

A trainer pool of gpus_per_replica = N > 1 runs each replica as N ranks (shard.py: an
FSDP2-sharded base, rank 0 serving): one placement group of N bundles {CPU: 1, GPU: 1},
STRICT_PACK when one node of the cluster has the GPUs and CPUs for all N, else PACK (as few
nodes as hold it), and one actor per rank (Rank). The ranks rendezvous through Ray: rank 0's
actor picks a free port on its node's address, the driver hands tcp://address:port to every
rank, and they join one torch.distributed group over it (gloo on CPU, NCCL for tensors on
GPU). A supervisor thread per replica waits on every rank; when any rank ends (its process,
or its node, died) it kills the others and removes the group, and places the replica anew:
the gateway saw rank 0's endpoint go, and its step recovery replays on the new incarnation.

Spec (JSON, written by pools/ray.DriverSpec): {"pool": {"id", "role", "base_model",
"replicas", "gpus_per_replica", "args"}, "registry_url", "actor_restarts", "listen_host"}.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time

log = logging.getLogger("loops_worker.ray_pool")


class Worker:
    """A worker actor: loads the model, serves gRPC, registers with the gateway."""

    def __init__(self, spec: dict, replica: int, token: str):
        from . import __main__ as wm

        logging.basicConfig(level=os.environ.get("LOOPS_WORKER_LOG", "INFO"), stream=sys.stderr,
                            format="%(asctime)s loops_worker %(levelname)s %(message)s")
        pool = spec["pool"]
        fd, self.token_file = tempfile.mkstemp(prefix="loops-join-")  # mode 0600
        with os.fdopen(fd, "w") as f:
            f.write(token)
        host = spec.get("listen_host") or "127.0.0.1"
        self.args = wm.parser().parse_args(_argv(spec, replica, self.token_file, host))
        creds, confine = wm.security(self.args)  # the credentials from the job's environment
        import ray

        if not self.args.advertise and host in ("0.0.0.0", "::"):
            self.args.advertise = ray.util.get_node_ip_address()
        engine, sampler, device, _ = wm.build(self.args)
        from .server import serve

        self.server = serve(engine, sampler, self.args.listen, creds, confine, threads=self.args.grpc_threads)
        gpus = len(ray.get_runtime_context().get_accelerator_ids().get("GPU", []))
        self.reg = wm.start_registration(self.args, engine, self.server.bound_port, creds, gpus=gpus)
        self.pid = os.getpid()
        log.info("replica %d of pool %s serving on port %d (pid %d, device %s)", replica, pool["id"], self.server.bound_port, self.pid, device)

    def info(self) -> dict:
        return {"pid": self.pid, "incarnation": self.reg.incarnation, "address": self.reg.address,
                "node_id": __import__("ray").get_runtime_context().get_node_id(), "done": self.reg.done.is_set()}


def _argv(spec: dict, replica: int, token_file: str, host: str) -> list:
    """The worker arguments of a replica's serving process (Worker, or a Rank's rank 0)."""
    pool = spec["pool"]
    listen = f"[{host}]:0" if ":" in host else f"{host}:0"
    tp = tensor_parallel(spec)
    return ["--listen", listen, "--model", pool["base_model"],
            *(["--vllm-tensor-parallel-size", str(tp)] if tp > 1 else []), *pool.get("args", []),
            "--register", spec["registry_url"], "--pool", pool["id"], "--replica", str(replica),
            "--join-token-file", token_file]


def world_size(spec: dict) -> int:
    """The ranks of one replica: gpus_per_replica for a trainer pool, else 1 (as the local
    provider's rankArgs)."""
    pool = spec["pool"]
    g = int(pool.get("gpus_per_replica", 0))
    return g if pool.get("role") == "trainer" and g > 1 else 1


def tensor_parallel(spec: dict) -> int:
    """vLLM's tensor-parallel size in one replica: gpus_per_replica for a sampler pool, else
    1 (as the local provider's rankArgs). The replica is one actor whose one bundle holds its
    N GPUs (bundle): vLLM's mp executor starts its N workers on the GPUs Ray shows the actor."""
    pool = spec["pool"]
    g = int(pool.get("gpus_per_replica", 0))
    return g if pool.get("role") == "sampler" and g > 1 else 1


def bundle(spec: dict) -> dict:
    """The one bundle of a single-actor replica (placed STRICT_PACK: one node): a CPU and the
    replica's GPUs. A sampler replica of N GPUs is so one node's N GPUs, all visible to its
    actor, where vLLM runs tensor-parallel (vllm_sampler.engine_args)."""
    g = int(spec["pool"].get("gpus_per_replica", 0))
    return {"CPU": 1.0, **({"GPU": float(g)} if g else {})}


class Rank:
    """One rank's actor of a multi-rank replica (module doc). Rank 0 serves and registers,
    the others follow its commands; run() returns (or the process dies) when the rank ends."""

    def __init__(self, spec: dict, replica: int, token: str, rank: int, world: int):
        logging.basicConfig(level=os.environ.get("LOOPS_WORKER_LOG", "INFO"), stream=sys.stderr,
                            format=f"%(asctime)s loops_worker rank {rank} %(levelname)s %(message)s")
        self.spec, self.replica, self.token, self.rank, self.world = spec, replica, token, rank, world
        self.pid = os.getpid()

    def endpoint(self) -> str:
        """Rank 0: the torch.distributed store address every rank joins (this node, a free port)."""
        import ray

        from .shard import free_port

        ip = ray.util.get_node_ip_address()
        port = free_port(ip)
        return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def run(self, init_method: str) -> int:
        """Loads the model, joins the group and serves (rank 0) or follows (others) until the
        rank ends; a rank never outlives its replica (the process exits)."""
        import threading

        import ray

        from . import __main__ as wm
        from . import shard

        pool = self.spec["pool"]
        host = self.spec.get("listen_host") or "127.0.0.1"
        if self.rank == 0:
            fd, token_file = tempfile.mkstemp(prefix="loops-join-")  # mode 0600
            with os.fdopen(fd, "w") as f:
                f.write(self.token)
            argv = _argv(self.spec, self.replica, token_file, host)
        else:
            argv = ["--model", pool["base_model"], *pool.get("args", [])]
        args = wm.parser().parse_args([*argv, "--world-size", str(self.world), "--rank", str(self.rank)])
        gpus = len(ray.get_runtime_context().get_accelerator_ids().get("GPU", []))
        engine, _, device, _ = wm.build(args, local_rank=0)  # Ray shows each rank its own GPU
        d = shard.init(self.rank, self.world, init_method, device)
        shard.setup(engine, d)
        if self.rank > 0:
            log.info("rank %d of %d of replica %d following (%s, pid %d)", self.rank, self.world, self.replica, device, self.pid)
            rc = shard.follow(engine, d)
            logging.shutdown()
            os._exit(rc)  # the group is gone with rank 0: this rank's state is of no further use
        creds, confine = wm.security(args)
        if not args.advertise and host in ("0.0.0.0", "::"):
            args.advertise = ray.util.get_node_ip_address()
        from .server import serve

        leader = shard.Leader(engine, d)
        server = serve(leader, shard.sampler(leader), args.listen, creds, confine, threads=args.grpc_threads)
        reg = wm.start_registration(args, leader, server.bound_port, creds, gpus=gpus * self.world)
        log.info("replica %d of pool %s: rank 0 of %d serving on port %d (pid %d, device %s)",
                 self.replica, pool["id"], self.world, server.bound_port, self.pid, device)
        done = threading.Event()
        threading.Thread(target=lambda: (reg.done.wait(), done.set()), daemon=True).start()
        done.wait()
        logging.shutdown()
        os._exit(0)  # the followers see the group end and exit too


class Driver:
    def __init__(self, spec: dict, token: str):
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.ray, self.pg, self.rm_pg, self.strategy = ray, placement_group, remove_placement_group, PlacementGroupSchedulingStrategy
        self.spec, self.token = spec, token
        g = int(spec["pool"].get("gpus_per_replica", 0))
        self.bundle = bundle(spec)
        self.cls = ray.remote(Worker)
        self.opts = dict(num_cpus=1, num_gpus=g, max_restarts=int(spec.get("actor_restarts", -1)), max_concurrency=4)
        self.replicas: dict[int, tuple] = {}
        self.world = world_size(spec)
        if self.world > 1:
            import threading

            self.bundle = {"CPU": 1.0, "GPU": 1.0}
            self.rank_cls = ray.remote(Rank)
            self.mu = threading.Lock()
            self.sharded: dict[int, "Replica"] = {}

    def scale(self, n: int) -> None:
        if self.world > 1:
            return self.scale_sharded(n)
        pool = self.spec["pool"]["id"]
        for r in sorted([r for r in self.replicas if r >= n], reverse=True):
            actor, pg = self.replicas.pop(r)
            self.ray.kill(actor, no_restart=True)
            self.rm_pg(pg)
            log.info("pool %s: replica %d stopped", pool, r)
        for r in range(n):
            if r in self.replicas:
                continue
            pg = self.pg([dict(self.bundle)], strategy="STRICT_PACK")
            strategy = self.strategy(placement_group=pg, placement_group_bundle_index=0)
            for attempt in range(50):  # a killed actor's name is freed asynchronously
                try:
                    actor = self.cls.options(**self.opts, scheduling_strategy=strategy,
                                             name=f"loops-{pool}-{r}").remote(self.spec, r, self.token)
                    break
                except ValueError:
                    if attempt == 49:
                        raise
                    time.sleep(0.2)
            self.replicas[r] = (actor, pg)
            log.info("pool %s: replica %d placed (bundle %s)", pool, r, self.bundle)

    def close(self) -> None:
        self.scale(0)

    # -- multi-rank replicas (module doc) --------------------------------------------------

    def scale_sharded(self, n: int) -> None:
        import threading

        pool = self.spec["pool"]["id"]
        with self.mu:
            gone = [self.sharded.pop(r) for r in sorted([r for r in self.sharded if r >= n], reverse=True)]
            for r in range(n):
                if r not in self.sharded:
                    rep = Replica(r)
                    self.sharded[r] = rep
                    rep.thread = threading.Thread(target=self.supervise, args=(rep,), name=f"replica-{r}", daemon=True)
                    rep.thread.start()
        for rep in gone:
            rep.stop.set()
            self.teardown(rep)
            log.info("pool %s: replica %d stopped", pool, rep.index)

    def strategy_for(self) -> str:
        """STRICT_PACK when one live node has the CPUs and GPUs of every rank, else PACK."""
        need = {k: v * self.world for k, v in self.bundle.items()}
        for node in self.ray.nodes():
            have = node.get("Resources", {})
            if node.get("Alive") and all(have.get(k, 0) >= v for k, v in need.items()):
                return "STRICT_PACK"
        return "PACK"

    def place(self, rep: "Replica") -> None:
        """rep's placement group and one actor per rank (the actors' names are freed
        asynchronously after a kill: retried)."""
        pool = self.spec["pool"]["id"]
        strategy = self.strategy_for()
        pg = self.pg([dict(self.bundle) for _ in range(self.world)], strategy=strategy)
        actors = []
        for i in range(self.world):
            name = f"loops-{pool}-{rep.index}" + (f"-rank{i}" if i else "")
            for attempt in range(50):
                try:
                    actors.append(self.rank_cls.options(
                        num_cpus=1, num_gpus=1, max_restarts=0, max_concurrency=2, name=name,
                        scheduling_strategy=self.strategy(placement_group=pg, placement_group_bundle_index=i),
                    ).remote(self.spec, rep.index, self.token, i, self.world))
                    break
                except ValueError:
                    if attempt == 49:
                        raise
                    time.sleep(0.2)
        with self.mu:
            rep.pg, rep.actors = pg, actors
        log.info("pool %s: replica %d placed: %d ranks, %s", pool, rep.index, self.world, strategy)

    def wait(self, rep: "Replica", refs: list) -> list:
        """The first of refs ready, or [] once rep is stopped."""
        while not rep.stop.is_set():
            ready, _ = self.ray.wait(refs, num_returns=1, timeout=1.0)
            if ready:
                return ready
        return []

    def supervise(self, rep: "Replica") -> None:
        """Keeps replica rep up: places it, hands rank 0's store address to every rank, and
        when any rank ends tears the whole replica down and places it again."""
        pool = self.spec["pool"]["id"]
        while not rep.stop.is_set():
            why = "stopped"
            try:
                self.place(rep)
                if self.wait(rep, [rep.pg.ready()]):
                    ep = self.ray.get(rep.actors[0].endpoint.remote())
                    nodes = self.ray.get([a.node.remote() for a in rep.actors])
                    log.info("pool %s: replica %d ranks on nodes %s, rendezvous at %s", pool, rep.index, nodes, ep)
                    runs = [a.run.remote(ep) for a in rep.actors]
                    ready = self.wait(rep, runs)
                    if ready:
                        i = runs.index(ready[0])
                        try:
                            why = f"rank {i} ended ({self.ray.get(ready[0])})"
                        except Exception as e:  # noqa: BLE001 - the actor died, or its start failed
                            why = f"rank {i} died: {type(e).__name__}: {str(e)[:300]}"
            except Exception as e:  # noqa: BLE001 - a rank died before the group formed
                why = f"{type(e).__name__}: {str(e)[:300]}"
            self.teardown(rep)
            if not rep.stop.is_set():
                log.warning("pool %s: replica %d lost (%s); placing it again", pool, rep.index, why)
                time.sleep(1.0)

    def teardown(self, rep: "Replica") -> None:
        with self.mu:
            actors, pg, rep.actors, rep.pg = rep.actors, rep.pg, [], None
        for a in actors:
            try:
                self.ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if pg is not None:
            try:
                self.rm_pg(pg)
            except Exception:  # noqa: BLE001
                pass


class Replica:
    """A multi-rank replica's state in the driver."""

    def __init__(self, index: int):
        import threading

        self.index = index
        self.stop = threading.Event()
        self.thread = None
        self.pg = None
        self.actors: list = []


def follow(spec: dict, token: str, creds, on_desired) -> int:
    """Streams the desired size from the gateway; returns the exit status."""
    import grpc

    from .proto import bpb  # noqa: F401
    from .register import target
    from loops.backend.v1 import registry_pb2 as rpb  # type: ignore
    from loops.backend.v1 import registry_pb2_grpc as rgrpc  # type: ignore

    pool = spec["pool"]["id"]
    backoff = 0.5
    while True:
        chan = creds.registry_channel(target(spec["registry_url"]))
        stub = rgrpc.RegistryServiceStub(chan)
        try:
            for msg in stub.WatchPool(rpb.WatchPoolRequest(pool_id=pool, join_token=token)):
                backoff = 0.5
                log.info("pool %s: desired replicas %d", pool, msg.desired_replicas)
                on_desired(msg.desired_replicas)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                log.info("pool %s was deleted by the gateway; exiting", pool)
                return 0
            if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT):
                log.error("the gateway refused this driver: %s: %s", e.code().name, e.details())
                return 1
            log.warning("gateway unreachable (%s); retrying in %.1fs (replicas keep serving)", e.code().name, backoff)
        finally:
            chan.close()
        time.sleep(backoff)
        backoff = min(2 * backoff, 10.0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m loops_worker.ray_pool")
    p.add_argument("--spec", required=True, help="the pool spec (JSON)")
    args = p.parse_args(argv)
    logging.basicConfig(level=os.environ.get("LOOPS_WORKER_LOG", "INFO"), stream=sys.stderr,
                        format="%(asctime)s loops_worker.ray_pool %(levelname)s %(message)s")
    spec = json.loads(args.spec)
    token = os.environ.get("LOOPS_JOIN_TOKEN", "")
    if not token:
        log.error("LOOPS_JOIN_TOKEN is not set")
        return 2
    from . import credentials

    creds = credentials.from_env()
    if creds is None:
        log.error("the workers' TLS credentials (LOOPS_WORKER_TLS_CERT, _KEY, _CA) are not set")
        return 2
    import ray

    ray.init()
    d = Driver(spec, token)
    try:
        return follow(spec, token, creds, d.scale)
    finally:
        d.close()


if __name__ == "__main__":
    sys.exit(main())
