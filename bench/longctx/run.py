"""bench/longctx: peak memory and step time of one training step on one long sequence, for
both engines, with and without the long-context path (activation checkpointing and the
chunked loss head), at several lengths. Each measurement is its own process (its peak RSS
is the step's plus the loaded model). Prints a markdown table and writes JSON (--out).

  ~/.cache/loops/venvs/torch-worker/bin/python bench/longctx/run.py --tokens 4096,16384,32768

The model: a Qwen3-shaped random model written once with transformers from a fixed seed
(--shape; default vocab 8192, hidden 128, 4 layers, 1 attention head of width 8, MLP 384,
untied: attention, quadratic in the length, kept cheap so that 32K tokens run in minutes on
two busy cores), float32 on both engines, 2 threads."""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def write_model(d: str, shape: dict) -> None:
    if os.path.isfile(os.path.join(d, "config.json")):
        return
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(max_position_embeddings=32768, tie_word_embeddings=False, rms_norm_eps=1e-6,
                      eos_token_id=2, bos_token_id=1, **shape)
    torch.manual_seed(1234)
    Qwen3ForCausalLM(cfg).save_pretrained(d)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", default="4096,16384,32768")
    p.add_argument("--engines", default="reference,torch")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model-dir", default=os.path.expanduser("~/.cache/loops/bench/longctx-model"))
    p.add_argument("--shape", default='{"vocab_size": 8192, "hidden_size": 128, "num_hidden_layers": 4, '
                                      '"num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 384}')
    p.add_argument("--out", default="")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per measurement")
    a = p.parse_args()
    write_model(a.model_dir, json.loads(a.shape))
    lcstep = os.path.join(a.model_dir, "lcstep")
    subprocess.run(["go", "build", "-o", lcstep, "./bench/longctx/cmd/lcstep"], cwd=ROOT, check=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "backends/torch"), os.path.join(ROOT, "gen/python")]),
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    rows = []
    for n in [int(x) for x in a.tokens.split(",")]:
        for eng in a.engines.split(","):
            for mode in ("plain", "long"):
                if eng == "reference":
                    cmd = [lcstep, "-model", a.model_dir, "-tokens", str(n), "-threads", str(a.threads),
                           "-checkpoint-rows", "-1" if mode == "plain" else "0"]
                else:
                    cmd = [sys.executable, os.path.join(HERE, "torch_step.py"), "--model", a.model_dir, "--tokens", str(n),
                           "--mode", mode, "--threads", str(a.threads)]
                try:
                    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
                except subprocess.TimeoutExpired:
                    rows.append({"engine": eng, "tokens": n, "mode": mode, "error": f"over {a.timeout} s"})
                    print(rows[-1], file=sys.stderr, flush=True)
                    continue
                if out.returncode != 0:
                    rows.append({"engine": eng, "tokens": n, "mode": mode, "error": out.stderr.strip().splitlines()[-1][-300:]})
                else:
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    r["mode"] = mode
                    rows.append(r)
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    print("| engine | tokens | path | step time (s) | peak RSS (MiB) | RSS before the step (MiB) | step's peak over it (MiB) | loss |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        path = "plain" if r["mode"] == "plain" else "checkpointed + chunked head"
        if "error" in r:
            print(f"| {r['engine']} | {r['tokens']} | {path} | {r['error']} | | | | |")
            continue
        print(f"| {r['engine']} | {r['tokens']} | {path} | {r['step_s']:.1f} | {r['peak_rss_mib']:.0f} | "
              f"{r['rss_before_mib']:.0f} | {r['peak_rss_mib'] - r['rss_before_mib']:.0f} | {r['loss']:.2f} |")


if __name__ == "__main__":
    main()
