"""python -m loops_worker.ray_pool --spec JSON: the pool driver, one Ray job per pool.

The gateway's ray provider (backends/pools/ray) submits it through the Ray Jobs API. It
follows the pool's desired size from the gateway (RegistryService.WatchPool over TLS,
authenticated by $LOOPS_JOIN_TOKEN) and keeps one worker actor per replica, each in a placement group of its
own (one bundle {CPU: 1, GPU: gpus_per_replica}, STRICT_PACK; Ray re-places the group when
its node dies). An actor serves the worker protocol in process (the same engine as
`python -m loops_worker`) and registers with the gateway as pool/replica; Ray restarts a dead
actor (max_restarts), and the restarted one registers as a new incarnation. Scaling down
kills the highest replicas' actors and removes their groups. When the gateway deletes the
pool (WatchPool ends with NOT_FOUND) the driver exits and Ray reclaims its actors.

An actor listens on spec["listen_host"] (127.0.0.1 unless the gateway was told otherwise:
a gateway on another host needs the actors reachable, which it must ask for), over mutual TLS
with the pool's credentials from the job's environment (LOOPS_WORKER_TLS_CERT, _KEY, _CA):
it answers only the gateway.

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
        listen = f"[{host}]:0" if ":" in host else f"{host}:0"
        argv = ["--listen", listen, "--model", pool["base_model"], *pool.get("args", []),
                "--register", spec["registry_url"], "--pool", pool["id"], "--replica", str(replica),
                "--join-token-file", self.token_file]
        self.args = wm.parser().parse_args(argv)
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


class Driver:
    def __init__(self, spec: dict, token: str):
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.ray, self.pg, self.rm_pg, self.strategy = ray, placement_group, remove_placement_group, PlacementGroupSchedulingStrategy
        self.spec, self.token = spec, token
        g = int(spec["pool"].get("gpus_per_replica", 0))
        self.bundle = {"CPU": 1.0, **({"GPU": float(g)} if g else {})}
        self.cls = ray.remote(Worker)
        self.opts = dict(num_cpus=1, num_gpus=g, max_restarts=int(spec.get("actor_restarts", -1)), max_concurrency=4)
        self.replicas: dict[int, tuple] = {}

    def scale(self, n: int) -> None:
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
