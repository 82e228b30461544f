#!/usr/bin/env python3
"""Loops' reference engine side by side with llama.cpp (serving) and PyTorch (training).

Serving: ``loops serve`` (reference engine) and llama.cpp's own ``llama-server`` run at the
same time on the same weights, a Qwen3-0.6B-shaped model with random weights written from a
fixed seed (bench/reference/torch_compare.py's folder), both with ``--threads`` threads. The
script asks each, in turn and alternating which goes first, through its OpenAI route
(``POST …/completions``, a prompt of token ids, temperature 0):

  * prefill: a ``--prompt-tokens``-token prompt, ``max_tokens`` 1, not streamed: the
    request's wall time; prompt tokens / that time is the prefill rate;
  * decode: a ``--decode-prompt``-token prompt, ``max_tokens`` ``--new``, streamed: tokens
    after the first / (time of the last chunk − time of the first chunk).

Each round uses fresh prompts (the same ones for both servers), so neither server's prompt
cache is hit; llama.cpp also gets ``cache_prompt: false`` and Loops ``prefix_cache_bytes=0``.
Beside the wall clock, each figure is also taken per CPU-second of the server process
(utime + stime from /proc/PID/stat, all threads, sampled at the request's start, first chunk
and end): on a shared, loaded machine the wall clock counts the time other processes hold
the cores, CPU time does not (spinning worker threads are counted, on both sides). The two
servers' greedy outputs are compared (the same model and prompt should give the same
tokens, up to float32 summation order on near ties).

Weights: the HF folder (bf16 safetensors) is read as float32 by Loops; llama.cpp gets a GGUF
converted from the same folder by the llama.cpp tree's own convert_hf_to_gguf.py with
``--outtype f32`` (its own gguf-py; bf16 → f32 is exact, so both hold the same float32 values). With
``--llama-dtypes f32,bf16`` a bf16 GGUF is served by a second llama-server too, as an extra
row: Loops' serving path holds float32 weights only (the bf16-held weights of issue 38 item 3
are not wired into ``loops serve``), so there is no bf16 pair to compare.

The converter needs a tokenizer in the folder; there is no model hub here, so the script
writes one from the Qwen2 vocabulary that the llama.cpp tree ships for its tokenizer tests
(models/ggml-vocab-qwen2.gguf: transformers reads it with the ``gguf`` package from PyPI;
the script checks it against that file's own test cases, ggml-vocab-qwen2.gguf.inp/.out).
Qwen3 uses Qwen2's byte-level BPE; the prompts are token ids either way.

llama-server is built from source when missing (bench/llamacpp/build.sh: the llama.cpp tree
vendored in the llama-cpp-python sdist from PyPI, cached in ~/.cache/loops/llama.cpp/<version>).

Training: ``--train`` runs bench/reference/torch_compare.py at the 0.6B shape
(forward_backward and sampling, Loops' fbbench against PyTorch eager + PEFT, --train-layers
layers) and prints its table next to the serving one.

    ~/.cache/loops/venvs/torch-worker/bin/python bench/llamacpp/compare.py --rounds 3 --train
"""

import argparse
import http.client
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "bench", "reference"))
import torch_compare  # noqa: E402  (the model folder and its seed are shared with it)

CACHE = os.path.expanduser(os.environ.get("LLAMACPP_CACHE", "~/.cache/loops/llama.cpp"))
VERSION = os.environ.get("LLAMACPP_VERSION", "0.3.36")
GGUF_PY = "0.19.0"  # the gguf package the vendored converter's own gguf-py is


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def cpu_flags():
    want = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
            "amx_bf16", "amx_tile")
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            return [f for f in want if f in have]
    return []


def build_llama_server():
    env = dict(os.environ, PYTHON=sys.executable, LLAMACPP_CACHE=CACHE, LLAMACPP_VERSION=VERSION)
    out = subprocess.run(["bash", os.path.join(HERE, "build.sh")], env=env, check=True, capture_output=False,
                         stdout=subprocess.PIPE, text=True).stdout
    return out.strip().splitlines()[-1]


def llama_tree():
    return os.path.join(CACHE, VERSION, "src", "vendor", "llama.cpp")


def gguf_pylib():
    """The gguf package from PyPI, installed into the cache (not into the venv)."""
    d = os.path.join(CACHE, f"pylib-gguf-{GGUF_PY}")
    if not os.path.exists(os.path.join(d, "gguf")):
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", d,
                        f"gguf=={GGUF_PY}"], check=True)
    return d


def sentencepiece_pylib():
    """sentencepiece from PyPI, in the cache: the converter imports it before it looks for a
    tokenizer.model (Qwen2Model.set_vocab), though a BPE folder never uses it."""
    d = os.path.join(CACHE, "pylib-sentencepiece")
    if not os.path.exists(os.path.join(d, "sentencepiece")):
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", d,
                        "sentencepiece"], check=True)
    return d


def write_tokenizer(folder):
    """Writes tokenizer.json and tokenizer_config.json from llama.cpp's Qwen2 test vocabulary."""
    if os.path.exists(os.path.join(folder, "tokenizer.json")):
        return
    code = r"""
import sys
from transformers import AutoTokenizer
models, out = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(models, gguf_file="ggml-vocab-qwen2.gguf")
inp = open(models + "/ggml-vocab-qwen2.gguf.inp").read().split("\n__ggml_vocab_test__\n")
exp = open(models + "/ggml-vocab-qwen2.gguf.out").read().split("\n")
for a, b in zip(inp, exp):
    got = tok.encode(a, add_special_tokens=False)
    if got != [int(x) for x in b.split()]:
        raise SystemExit(f"tokenizer from ggml-vocab-qwen2.gguf differs from llama.cpp's test case {a[:40]!r}")
tok.save_pretrained(out)
print(len(inp), "test cases equal")
"""
    tmp = folder + ".tok-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=gguf_pylib(), HF_HUB_OFFLINE="1")
    subprocess.run([sys.executable, "-c", code, os.path.join(llama_tree(), "models"), tmp], env=env, check=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        os.replace(os.path.join(tmp, f), os.path.join(folder, f))
    shutil.rmtree(tmp, ignore_errors=True)


def serve_folder(workdir, layers):
    """The bench model (torch_compare's folder) plus a tokenizer, as links in a folder of its own."""
    src = os.path.join(workdir, f"qwen3-0.6b-shape-random-{layers}l")
    torch_compare.write_random_qwen3(src, layers)
    dst = src + "-tok"
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f.endswith((".json", ".safetensors")) and not os.path.exists(os.path.join(dst, f)):
            os.symlink(os.path.join(src, f), os.path.join(dst, f))
    write_tokenizer(dst)
    return dst


def convert(folder, dtype):
    out = f"{folder}-{dtype}.gguf"
    if os.path.exists(out):
        return out
    # The converter's own gguf-py (same tree; PyPI's gguf 0.19.0 lacks newer architectures
    # that the converter's modules name at import).
    env = {k: v for k, v in os.environ.items() if k not in ("NO_LOCAL_GGUF",)}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=sentencepiece_pylib())
    subprocess.run(["nice", "-n", "10", sys.executable, os.path.join(llama_tree(), "convert_hf_to_gguf.py"), folder,
                    "--outtype", dtype, "--outfile", out + ".tmp"], env=env, check=True)
    os.replace(out + ".tmp", out)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu(pid):
    """utime + stime of a process (all its threads), seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    def __init__(self, name, cmd, port, path, model, headers, extra, env=None):
        self.name, self.port, self.path, self.model, self.headers, self.extra = name, port, path, model, headers, extra
        self.logf = tempfile.TemporaryFile()
        self.p = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_ready(self, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if self.p.poll() is not None:
                self.logf.seek(0)
                raise SystemExit(f"{self.name} exited: {self.logf.read().decode(errors='replace')[-3000:]}")
            try:
                self.request([1, 2, 3], 1)
                return
            except (OSError, http.client.HTTPException, RuntimeError):
                time.sleep(2)
        raise SystemExit(f"{self.name} not ready after {timeout} s")

    def request(self, prompt, max_tokens, stream=False):
        body = dict(model=self.model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=stream, **self.extra)
        if stream:
            body["stream_options"] = {"include_usage": True}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
        c0, t0 = proc_cpu(self.p.pid), time.perf_counter()
        conn.request("POST", self.path, json.dumps(body), dict(self.headers, **{"Content-Type": "application/json"}))
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"{self.name}: HTTP {r.status}: {r.read()[:500]!r}")
        res = dict(text="", usage=None, timings=None)
        if not stream:
            d = json.loads(r.read())
            t1, c1 = time.perf_counter(), proc_cpu(self.p.pid)
            res.update(wall=t1 - t0, cpu=c1 - c0, text=d["choices"][0]["text"], usage=d.get("usage"),
                       timings=d.get("timings"))
            conn.close()
            return res
        first = last = None
        cfirst = None
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            d = json.loads(data)
            if d.get("usage"):
                res["usage"] = d["usage"]
            if d.get("timings"):
                res["timings"] = d["timings"]
            for ch in d.get("choices") or []:
                if ch.get("text"):
                    now = time.perf_counter()
                    if first is None:
                        first, cfirst = now, proc_cpu(self.p.pid)
                    last = now
                    res["text"] += ch["text"]
        cend = proc_cpu(self.p.pid)
        conn.close()
        res.update(first=first - t0, wall=last - t0, decode_wall=last - first, cpu_first=cfirst - c0,
                   decode_cpu=cend - cfirst)
        return res

    def rss_mib(self):
        for line in open(f"/proc/{self.p.pid}/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()


def start_loops(a, folder, datadir):
    port = free_port()
    cmd = [a.loops_bin, "serve", "--addr", f"127.0.0.1:{port}", "--data-dir", datadir, "--model", folder,
           "--backend", "reference", "--backend-opt", f"threads={a.threads}", "--backend-opt", "prefix_cache_bytes=0",
           "--log-level", "warn"]
    log("loops:", " ".join(cmd))
    return Server("loops", cmd, port, "/oai/api/v1/completions", folder,
                  {"Authorization": "Bearer tml-bench"}, {})


def start_llama(a, gguf, name):
    port = free_port()
    ctx = max(2048, a.prompt_tokens + a.new + 64)
    cmd = [a.llama_server, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(a.threads),
           "-tb", str(a.threads), "-c", str(ctx), "-np", "1"] + a.llama_args.split()
    log(f"{name}:", " ".join(cmd))
    return Server(name, cmd, port, "/v1/completions", "bench", {}, {"cache_prompt": False})


def median(x):
    return statistics.median(x) if x else float("nan")


def serving(a, folder):
    rng = random.Random(torch_compare.SEED + 1)
    vocab = json.load(open(os.path.join(folder, "config.json")))["vocab_size"]
    # Ordinary tokens only (Qwen2's byte-level BPE ends at 151643; above are special tokens).
    draw = lambda n: [rng.randrange(151643 if vocab > 151643 else vocab) for _ in range(n)]
    datadir = tempfile.mkdtemp(prefix="loops-llamabench-")
    servers = []
    try:
        servers.append(start_loops(a, folder, datadir))
        for dt in filter(None, a.llama_dtypes.split(",")):
            servers.append(start_llama(a, convert(folder, dt), f"llama.cpp-{dt}"))
        for s in servers:
            s.wait_ready(1800)
            log(f"{s.name} ready, RSS {s.rss_mib():.0f} MiB")
        # warm-up: one short prefill and decode each
        warm = draw(32)
        for s in servers:
            s.request(warm, 4, stream=True)
        rows = {s.name: [] for s in servers}
        loads = [uptime()]
        for r in range(a.rounds):
            prompt, dprompt = draw(a.prompt_tokens), draw(a.decode_prompt)
            order = servers if r % 2 == 0 else servers[::-1]
            outs = {}
            for s in order:
                p = s.request(prompt, 1)
                d = s.request(dprompt, a.new, stream=True)
                n = d["usage"]["completion_tokens"] if d.get("usage") else None
                row = dict(round=r, prefill_wall=p["wall"], prefill_cpu=p["cpu"],
                           prefill_tok_s=a.prompt_tokens / p["wall"], prefill_tok_cpu_s=a.prompt_tokens / p["cpu"],
                           decode_tokens=n, decode_wall=d["decode_wall"], decode_cpu=d["decode_cpu"],
                           decode_tok_s=(n - 1) / d["decode_wall"] if n else None,
                           decode_tok_cpu_s=(n - 1) / d["decode_cpu"] if n and d["decode_cpu"] else None,
                           prompt_tokens=(p.get("usage") or {}).get("prompt_tokens"),
                           own_timings={"prefill": p.get("timings"), "decode": d.get("timings")},
                           text=d["text"], rss_mib=s.rss_mib())
                rows[s.name].append(row)
                outs[s.name] = d["text"]
                log(f"round {r} {s.name}: prefill {row['prefill_tok_s']:.1f} tok/s ({row['prefill_tok_cpu_s']:.1f}/CPU-s), "
                    f"decode {row['decode_tok_s'] or 0:.2f} tok/s ({row['decode_tok_cpu_s'] or 0:.2f}/CPU-s), n={n}")
            loads.append(uptime())
        return rows, loads
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(datadir, ignore_errors=True)


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def print_serving(rows, a):
    names = list(rows)
    keys = (("prefill_tok_s", f"prefill tok/s ({a.prompt_tokens} tok)"), ("prefill_tok_cpu_s", "prefill tok/CPU-s"),
            ("decode_tok_s", f"decode tok/s ({a.new} new)"), ("decode_tok_cpu_s", "decode tok/CPU-s"),
            ("rss_mib", "server RSS MiB"))
    print(f"{'measure (median of rounds)':<28}" + "".join(f"{n:>18}" for n in names) +
          "".join(f"{'loops/' + n:>22}" for n in names[1:]))
    for k, label in keys:
        vals = [median([x[k] for x in rows[n] if x[k] is not None]) for n in names]
        print(f"{label:<28}" + "".join(f"{v:>18.2f}" for v in vals) + "".join(f"{vals[0] / v:>22.3f}" for v in vals[1:]))
    for n in names:
        print(f"  {n} per round: prefill tok/s " + ", ".join(f"{x['prefill_tok_s']:.1f}" for x in rows[n]) +
              "; decode tok/s " + ", ".join(f"{x['decode_tok_s'] or 0:.2f}" for x in rows[n]))
    base = rows[names[0]]
    for n in names[1:]:
        same = [common_prefix(x["text"], y["text"]) for x, y in zip(base, rows[n])]
        print(f"  greedy text, loops vs {n}: common prefix {same} of {[len(x['text']) for x in base]} characters")


def training(a):
    out = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
    cmd = [sys.executable, os.path.join(REPO, "bench", "reference", "torch_compare.py"), "--models", "qwen3-0.6b-shape",
           "--layers", str(a.train_layers), "--threads", str(a.threads), "--iters", str(a.train_iters),
           "--workdir", a.workdir, "--out", out]
    log("training:", " ".join(cmd))
    before = uptime()
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    rep = json.load(open(out))
    os.unlink(out)
    rep["load"] = [before, uptime()]
    return rep


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=os.path.expanduser("~/.cache/loops/bench"), help="model folders and GGUFs")
    ap.add_argument("--layers", type=int, default=28, help="layers of the Qwen3-0.6B-shaped model served")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=700)
    ap.add_argument("--decode-prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--llama-dtypes", default="f32", help="GGUFs served by llama.cpp: f32 and/or bf16")
    ap.add_argument("--llama-args", default="", help="extra llama-server arguments")
    ap.add_argument("--loops-bin", default="", help="a built loops binary (default: go build ./cmd/loops)")
    ap.add_argument("--llama-server", default="", help="a built llama-server (default: build.sh's, built if missing)")
    ap.add_argument("--no-serving", action="store_true", help="skip the llama.cpp comparison")
    ap.add_argument("--train", action="store_true", help="also run torch_compare.py at the 0.6B shape")
    ap.add_argument("--train-layers", type=int, default=28)
    ap.add_argument("--train-iters", type=int, default=2)
    ap.add_argument("--out", default="", help="write everything as JSON here")
    a = ap.parse_args()

    report = dict(machine=dict(cpu=torch_compare.cpu_name(), nproc=os.cpu_count(), flags=cpu_flags(),
                               platform=platform.platform()), args=vars(a))
    if not a.no_serving:
        if not a.llama_server and a.llama_dtypes:
            a.llama_server = build_llama_server()
        if not a.loops_bin:
            a.loops_bin = os.path.join(a.workdir, "loops-bench-bin")
            subprocess.run(["go", "build", "-o", a.loops_bin, "./cmd/loops"], cwd=REPO, check=True)
        folder = serve_folder(a.workdir, a.layers)
        rows, loads = serving(a, folder)
        report["serving"], report["serving_load"] = rows, loads
    if a.train:
        report["training"] = training(a)

    print(f"machine: {report['machine']['cpu']}, {report['machine']['nproc']} CPUs, flags {' '.join(report['machine']['flags'])}")
    if "serving" in report:
        print(f"serving, {a.layers} layers, {a.threads} threads; load: {report['serving_load'][0]} … {report['serving_load'][-1]}")
        print_serving(report["serving"], a)
    if "training" in report:
        t = report["training"]
        print(f"training (torch_compare.py, {a.train_layers} layers); load: {t['load'][0]} … {t['load'][1]}")
        torch_compare.print_table(t["results"])
    if a.out:
        json.dump(report, open(a.out, "w"), indent=2)


if __name__ == "__main__":
    main()
