"""lm-evaluation-harness (lm_eval, from PyPI) on a deployed checkpoint of loops/tiny through
/oai/api/v1, checked against transformers.

    LOOPS_URL=http://127.0.0.1:PORT LOOPS_API_KEY=tml-anything \
      LMEVAL_PYTHON=.../bin/python TORCH_PYTHON=.../bin/python python lmeval_check.py

1. The tinker SDK trains a LoRA of loops/tiny for a few steps and saves it for sampling; the
   checkpoint is deployed (POST /v1/deployments, name "lmeval") and exported merged
   (GET /v1/checkpoint/export_url, format merged: a Hugging Face folder with the tokenizer).
2. A multiple-choice task (lm-eval's loglikelihood requests: /completions with echo and
   logprobs) and a generate_until task, each a task YAML over a local JSONL file written
   here, run with `lm_eval --model local-completions` (tokenizer: the export folder), and the
   generate_until task with `--model local-chat-completions --apply_chat_template`, all on
   the deployment, offline (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE).
3. reference.py (transformers on the merged export, in TORCH_PYTHON) computes each choice's
   log-likelihood sum and the greedy answers independently: every lm-eval sum (--log_samples)
   is within 1e-4 of transformers', the accuracy lm-eval reports is transformers', and each
   generated answer is transformers' greedy one.

Exits 1 on any failure.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import tinker
from tinker import types

URL = os.environ["LOOPS_URL"].rstrip("/")
KEY = os.environ.get("LOOPS_API_KEY", "tml-clients-test")
LMEVAL = os.environ["LMEVAL_PYTHON"]
TORCH = os.environ["TORCH_PYTHON"]
HERE = Path(__file__).resolve().parent
BASE = "loops/tiny"
NAME = "lmeval"
TOL = 1e-4

MC = [
    {"question": "The cat sat on the", "choices": ["mat", "moon", "river bank"], "answer": 0},
    {"question": "Water is", "choices": ["wet", "dry", "loud and red"], "answer": 0},
    {"question": "One, two,", "choices": ["three", "seven", "blue"], "answer": 0},
    {"question": "hello", "choices": ["world", "there", "friend"], "answer": 1},
    {"question": "The sky is", "choices": ["blue", "green", "made of cheese", "up"], "answer": 0},
    {"question": "def main():", "choices": ["pass", "return", "print(1)"], "answer": 0},
    {"question": "Paris is in", "choices": ["France", "Spain"], "answer": 0},
    {"question": "A B C", "choices": ["D", "E", "Z"], "answer": 0},
]
GEN = [
    {"question": "The cat sat on the", "answer": " mat"},
    {"question": "hello world,", "answer": " again"},
    {"question": "Once upon a time", "answer": " there"},
    {"question": "1 2 3", "answer": " 4"},
]
MAX_GEN = 8


def check(cond: bool, what: str) -> None:
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


def api(method: str, path: str, body: dict | None = None) -> bytes:
    req = urllib.request.Request(URL + path, method=method, headers={"X-API-Key": KEY, "Content-Type": "application/json"},
                                 data=json.dumps(body).encode() if body is not None else None)
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read()


def checkpoint() -> str:
    """A LoRA of loops/tiny trained a few steps (so it is not the base model), saved for sampling."""
    service = tinker.ServiceClient(base_url=URL, api_key=KEY)
    tc = service.create_lora_training_client(base_model=BASE, rank=8, seed=3).result(timeout=120)
    tok = tc.get_tokenizer()
    ids = tok.encode("The cat sat on the mat. Water is wet. One, two, three.")
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})
    for _ in range(3):
        tc.forward_backward([datum], "cross_entropy").result(timeout=120)
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=120)
    return tc.save_weights_for_sampler("lmeval").result(timeout=120).path


def export(path: str, dest: Path) -> None:
    q = urllib.parse.urlencode({"path": path, "format": "EXPORT_FORMAT_MERGED"})
    url = json.loads(api("GET", "/v1/checkpoint/export_url?" + q))["url"]
    if url.startswith("/"):
        url = URL + url
    req = urllib.request.Request(url, headers={"X-API-Key": KEY})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            data = r.read()
    except urllib.error.HTTPError as e:
        check(False, f"the merged export downloads: {e.code} {e.read()[:500]!r}")
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        tf.extractall(dest, filter="data")


def write_tasks(d: Path) -> None:
    (d / "mc.jsonl").write_text("".join(json.dumps(x) + "\n" for x in MC))
    (d / "gen.jsonl").write_text("".join(json.dumps(x) + "\n" for x in GEN))
    common = "dataset_path: json\ntest_split: test\ndoc_to_text: \"{{question}}\"\n"
    (d / "loops_mc.yaml").write_text(
        f"task: loops_mc\n{common}dataset_kwargs:\n  data_files:\n    test: {d / 'mc.jsonl'}\n"
        "output_type: multiple_choice\ndoc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{answer}}\"\n"
        "metric_list:\n  - metric: acc\n")
    (d / "loops_gen.yaml").write_text(
        f"task: loops_gen\n{common}dataset_kwargs:\n  data_files:\n    test: {d / 'gen.jsonl'}\n"
        "output_type: generate_until\ndoc_to_target: \"{{answer}}\"\n"
        f"generation_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: {MAX_GEN}\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n")


def start_lm_eval(d: Path, out: Path, model: str, model_args: str, tasks: str, *extra: str) -> tuple[subprocess.Popen, str]:
    """Starts lm_eval (--log_samples into out)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               OPENAI_API_KEY=KEY, HF_DATASETS_CACHE=str(out / "hf-datasets"), TOKENIZERS_PARALLELISM="false")
    cmd = [LMEVAL, "-m", "lm_eval", "--model", model, "--model_args", model_args, "--tasks", tasks,
           "--include_path", str(d), "--output_path", str(out), "--log_samples", *extra]
    print("$ lm_eval " + " ".join(cmd[3:]), flush=True)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), f"lm_eval --model {model} --tasks {tasks}"


def finish(p: subprocess.Popen, what: str, t0: float) -> str:
    stdout, stderr = p.communicate()
    if p.returncode != 0:
        sys.stderr.write(stdout[-3000:] + stderr[-6000:])
    check(p.returncode == 0, f"{what} ran ({time.time() - t0:.1f}s)")
    return stdout


def outputs(out: Path) -> tuple[dict[str, list[dict]], dict]:
    """lm_eval's samples per task and its results."""
    samples: dict[str, list[dict]] = {}
    for f in out.rglob("samples_*.jsonl"):
        task = f.name[len("samples_"):].rsplit("_", 1)[0]
        samples[task] = sorted((json.loads(line) for line in f.read_text().splitlines() if line.strip()), key=lambda s: s["doc_id"])
    results = [json.loads(f.read_text()) for f in out.rglob("results_*.json")]
    check(len(results) == 1, f"lm_eval wrote its results and samples in {out.name}")
    return samples, results[0]["results"]


def args(sample: dict) -> list[tuple]:
    """lm-eval's arguments of a sample's requests: (context, continuation or generation kwargs)."""
    items = sorted(sample["arguments"].items(), key=lambda kv: int(kv[0].rsplit("_", 1)[1]))
    return [(a["arg_0"], a["arg_1"]) for _, a in items]


def main() -> None:
    t0 = time.time()
    path = checkpoint()
    print(f"checkpoint {path} ({time.time() - t0:.1f}s)", flush=True)
    api("POST", "/v1/deployments", {"name": NAME, "checkpoints": [path]})
    models = json.loads(api("GET", "/oai/api/v1/models"))["data"]
    check(any(m["id"] == NAME for m in models), f"deployment {NAME} is listed by GET /models")

    with tempfile.TemporaryDirectory(prefix="loops-lmeval-") as tmp:
        d = Path(tmp)
        merged = d / "merged"
        export(path, merged)
        check((merged / "config.json").is_file() and (merged / "tokenizer.json").is_file(),
              "the merged export has a config and a tokenizer")
        write_tasks(d)

        # lm-eval's requests, as its task config makes them: the multiple-choice context is
        # the question and each continuation " " + the choice (target_delimiter); a
        # generate_until prompt is the question, or, for chat, one user message.
        mc_args = [[{"context": x["question"], "continuation": " " + c} for c in x["choices"]] for x in MC]
        spec = {"model": str(merged), "mc": mc_args, "gen": [x["question"] for x in GEN],
                "chat": [x["question"] for x in GEN], "max_gen": MAX_GEN, "until": ["\n"]}
        (d / "spec.json").write_text(json.dumps(spec))

        # The two lm_eval runs and transformers' reference run side by side.
        t1 = time.time()
        completions = start_lm_eval(
            d, d / "out-completions", "local-completions",
            f"model={NAME},base_url={URL}/oai/api/v1/completions,tokenizer={merged},tokenizer_backend=huggingface,"
            "num_concurrent=1,max_retries=1,timeout=120", "loops_mc,loops_gen", "--batch_size", "4")
        chat = start_lm_eval(
            d, d / "out-chat", "local-chat-completions",
            f"model={NAME},base_url={URL}/oai/api/v1/chat/completions,num_concurrent=1,max_retries=1,timeout=120",
            "loops_gen", "--apply_chat_template")
        ref_p = subprocess.Popen([TORCH, str(HERE / "reference.py"), str(d / "spec.json")], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
        ref = json.loads(finish(ref_p, "reference.py (transformers on the merged export)", t1))
        sys.stdout.write(finish(*completions, t1)[-1500:])
        sys.stdout.write(finish(*chat, t1)[-1500:])
        samples, results = outputs(d / "out-completions")
        chat_samples, _ = outputs(d / "out-chat")

        check([[{"context": c, "continuation": x} for c, x in args(s)] for s in samples["loops_mc"]] == mc_args,
              "lm-eval's loglikelihood requests are the (context, continuation) pairs transformers scored")
        check([args(s)[0][0] for s in samples["loops_gen"]] == spec["gen"], "lm-eval's generate_until prompts are the questions")
        check([json.loads(args(s)[0][0][0]) for s in chat_samples["loops_gen"]] == [[{"role": "user", "content": q}] for q in spec["chat"]],
              "lm-eval's chat requests are one user message each")

        worst, correct = 0.0, 0
        for s, want in zip(samples["loops_mc"], ref["mc"]):
            got = [float(r[0][0]) for r in s["resps"]]
            check(len(got) == len(want), f"doc {s['doc_id']}: a log-likelihood per choice")
            worst = max(worst, *(abs(g - w) for g, w in zip(got, want)))
            correct += int(max(range(len(want)), key=lambda i: want[i]) == s["doc"]["answer"])
        print(f"lm-eval's per-choice log-likelihood sums vs transformers: max_abs_diff {worst:.3g}")
        check(worst <= TOL, f"every choice's log-likelihood is transformers' within {TOL}")
        acc = results["loops_mc"]["acc,none"]
        check(abs(acc - correct / len(MC)) < 1e-9, f"lm-eval's accuracy {acc} is transformers' {correct}/{len(MC)}")

        for name, ss, want in (("local-completions", samples["loops_gen"], ref["gen"]),
                               ("local-chat-completions", chat_samples["loops_gen"], ref["chat"])):
            got = [s["resps"][0][0] for s in ss]
            check(got == want, f"{name}: generate_until answers {got} are transformers' greedy ones {want}")
    print(f"lmeval_check: all checks passed ({time.time() - t0:.1f}s)")


if __name__ == "__main__":
    main()
