"""What every recipe does around its loop: connect, log metrics and checkpoints, show progress."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import tinker
from tinker import types
from tqdm import tqdm

from loops_cookbook.config import BaseConfig, base_url, log_dir_for


class Run:
    """One recipe run: the training client, its log folder and its progress bar.

    Files in log_dir: config.json (the config as run), metrics.jsonl (one JSON object per
    step), checkpoints.jsonl (one per save: name, step, state_path, sampler_path)."""

    def __init__(self, recipe: str, cfg: BaseConfig, total: int | None = None) -> None:
        self.recipe = recipe
        self.cfg = cfg
        # With cfg.resume: the loop state of the checkpoint the run continues from (what the
        # recipe's loops read to skip the steps done and draw what comes next), else None.
        self.resumed: dict | None = None
        self.start_step = 0
        self.earlier: list[dict] = []  # a resumed run's metrics rows up to its checkpoint
        ckpt = resume_point(recipe, Path(cfg.resume)) if cfg.resume else None
        self.log_dir = Path(cfg.resume) if cfg.resume else log_dir_for(recipe, cfg)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.log_dir / "config.json").write_text(json.dumps(dataclasses.asdict(
            dataclasses.replace(cfg, resume=None)), indent=2, default=str) + "\n")
        if ckpt is not None:
            self.resumed, self.start_step = ckpt["resume"], int(ckpt["step"])
            self.earlier = _keep_rows(self.log_dir / "metrics.jsonl", self.start_step)
        self._metrics = open(self.log_dir / "metrics.jsonl", "a", buffering=1)
        self._checkpoints = open(self.log_dir / "checkpoints.jsonl", "a", buffering=1)
        self.service = tinker.ServiceClient(base_url=base_url(cfg), user_metadata={"recipe": recipe})
        _OPEN.append(self)
        if ckpt is not None:
            # weights and Adam state (moments and step count) as they were after its step
            self.training: tinker.TrainingClient = resolved(self.service.create_training_client_from_state_with_optimizer(
                ckpt["state_path"], user_metadata={"recipe": recipe}))
        else:
            self.training = resolved(self.service.create_lora_training_client(
                base_model=cfg.model, rank=cfg.lora_rank, seed=cfg.seed, user_metadata={"recipe": recipe}))
        self.run_id = str(self.training.model_id)
        self.tokenizer = self.training.get_tokenizer()
        resumed = f", resumed after step {self.start_step} from {ckpt['state_path']}" if ckpt is not None else ""
        print(f"run {self.run_id} ({recipe}, {cfg.model}{resumed}); logs in {self.log_dir}", file=sys.stderr, flush=True)
        url = base_url(cfg)
        console = os.environ.get("LOOPS_CONSOLE_URL") or (url.rstrip("/") + "/" if url else "")
        print(f"watch it: loops runs show {self.run_id}" + (f", or the console at {console}" if console else ""),
              file=sys.stderr, flush=True)
        self.total = total if total is not None else cfg.steps
        self._bar = tqdm(total=self.total, initial=self.start_step, desc=recipe, unit="step",
                         disable=not cfg.progress, file=sys.stderr, dynamic_ncols=True)
        self._t0 = time.time()

    def log(self, step: int, **metrics: Any) -> None:
        """Appends one metrics row and advances the progress bar, showing the main figures."""
        row = {"step": step, "time": round(time.time() - self._t0, 3)}
        row.update({k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for k, v in metrics.items()})
        self._metrics.write(json.dumps(row) + "\n")
        shown = {k: f"{v:.4g}" for k, v in metrics.items() if isinstance(v, float)}
        self._bar.set_postfix(dict(list(shown.items())[:4]), refresh=False)
        self._bar.update(1)

    def save(self, name: str, step: int, resume: dict | None = None) -> dict:
        """Saves training state (weights + optimizer) and sampler weights; records both paths,
        and with resume the loop state a resumed run continues from (`resume`: the recipe
        and what its loops need, JSON)."""
        state = self.training.save_state(name).result().path
        sampler = self.training.save_weights_for_sampler(name).result().path
        rec = {"name": name, "step": step, "state_path": state, "sampler_path": sampler}
        if resume is not None:
            rec["resume"] = {"recipe": self.recipe, **resume}
        self._checkpoints.write(json.dumps(rec) + "\n")
        return rec

    def maybe_save(self, step: int, resume: Callable[[], dict] | None = None) -> None:
        """Saves every cfg.save_every steps (step counts from 1), with the loop state
        resume() returns when given (a run can then continue from the checkpoint)."""
        if self.cfg.save_every > 0 and step % self.cfg.save_every == 0 and step < self.total:
            self.save(f"{step:06d}", step, resume() if resume else None)

    def finish(self, step: int) -> dict:
        """Saves the final checkpoint, closes the files, ends the session (which frees the
        run on the server) and prints where everything is."""
        rec = self.save("final", step)
        self._bar.close()
        self._metrics.close()
        self._checkpoints.close()
        self.close("success")
        print(f"done: run {self.run_id}, final checkpoint {rec['state_path']} (sampler {rec['sampler_path']})",
              file=sys.stderr, flush=True)
        return rec

    def close(self, status: str, detail: str | None = None) -> None:
        """Ends the recipe's session: the server unloads its run at once instead of keeping it
        live until the session's TTL (a workspace at max_concurrent_runs can start the next
        recipe right away). Checkpoints stay. SDKs before ServiceClient.close (tinker < 0.38)
        leave the session to expire. Idempotent."""
        if self in _OPEN:
            _OPEN.remove(self)
        close = getattr(self.service, "close", None)
        if close is None:
            return
        try:
            close(status, detail).result(timeout=30)
        except Exception as e:  # noqa: BLE001 - the session still expires by itself
            print(f"warning: could not end the session: {e}", file=sys.stderr, flush=True)

    def optim_step(self) -> dict:
        """Applies accumulated gradients with the config's learning rate; returns the server's metrics."""
        out = self.training.optim_step(types.AdamParams(learning_rate=self.cfg.learning_rate)).result()
        return dict(getattr(out, "metrics", None) or {})


def resume_point(recipe: str, log_dir: Path) -> dict:
    """The checkpoint a run logged in log_dir continues from: the last record of its
    checkpoints.jsonl with a state and loop state (as tinker-cookbook's
    checkpoint_utils.get_last_checkpoint takes the last with a state_path). ValueError
    says why there is none."""
    path = log_dir / "checkpoints.jsonl"
    if not path.exists():
        raise ValueError(f"--resume {log_dir}: no checkpoints.jsonl there (a run's log folder, or a pilot's, has one)")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    records = [r for r in records if r.get("state_path")]
    if not records:
        raise ValueError(f"--resume {log_dir}: no checkpoint saved yet (save_every=N saves one every N steps; a pilot saves one)")
    last = records[-1]
    if last.get("name") == "final":
        raise ValueError(f"--resume {log_dir}: that run finished (final checkpoint at step {last.get('step')}): nothing to continue")
    state = last.get("resume")
    if not isinstance(state, dict):
        raise ValueError(f"--resume {log_dir}: its last checkpoint ({last.get('name')}) has no loop state: {recipe} cannot continue from it")
    if state.get("recipe") != recipe:
        raise ValueError(f"--resume {log_dir}: that folder holds a {state.get('recipe')} run, not {recipe}")
    return last


def _keep_rows(path: Path, last_step: int) -> list[dict]:
    """Drops the metrics rows after last_step (logged after the checkpoint by a run that was
    then interrupted: the resumed run logs those steps again); returns the rows kept."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    kept = [r for r in rows if r.get("step", 0) <= last_step]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return kept


# Runs whose session is still open: cli.cmd_run ends them when a recipe stops early.
_OPEN: list[Run] = []


def close_open_runs(status: str, detail: str | None = None) -> None:
    """Ends the session of every run not finished (a recipe that failed or was interrupted)."""
    for run in list(_OPEN):
        run.close(status, detail)


def resolved(client: Any) -> Any:
    """The client itself from a client-creation call: tinker 0.38 returns a future of it
    (using the future as the client is deprecated and warns), earlier releases the client."""
    result = getattr(client, "result", None)
    return result() if callable(result) else client


def rng_state(saved: Any) -> tuple:
    """A random.Random state from its JSON form (getstate()'s tuples come back as lists)."""
    version, internal, gauss = saved
    return (version, tuple(internal), gauss)


def sft_datum(tokens: Sequence[int], weights: Sequence[float], max_length: int) -> types.Datum:
    """A next-token datum: input tokens[:-1], targets tokens[1:], weights aligned with targets."""
    tokens, weights = list(tokens)[:max_length], list(weights)[:max_length]
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [float(w) for w in weights[1:]]},
    )


def datum_weight(d: types.Datum) -> float:
    return float(sum(d.loss_fn_inputs["weights"].tolist()))


def weighted_logprob_sums(data: Sequence[types.Datum], outputs: Iterable[Any]) -> list[float]:
    """Σ weight·logprob per datum, from forward/forward_backward outputs."""
    sums = []
    for d, out in zip(data, outputs):
        lp = out["logprobs"].tolist()
        w = d.loss_fn_inputs["weights"].tolist()
        sums.append(float(sum(a * b for a, b in zip(lp, w))))
    return sums


def forward_logprob_sums(tc: tinker.TrainingClient, data: Sequence[types.Datum], per_request: int | None = None) -> list[float]:
    """Σ weight·logprob per datum under the current weights (forward only), in requests of at
    most per_request datums (all at once when None; Loops takes at most 16 images a request)."""
    data = list(data)
    step = per_request or max(1, len(data))
    futures = [tc.forward(data[i:i + step], "cross_entropy") for i in range(0, len(data), step)]
    sums: list[float] = []
    for i, f in zip(range(0, len(data), step), futures):
        sums += weighted_logprob_sums(data[i:i + step], f.result().loss_fn_outputs)
    return sums


def mean_nll(tc: tinker.TrainingClient, data: Sequence[types.Datum], per_request: int | None = None) -> float:
    """Per-token negative log-likelihood of data under the current weights (forward only)."""
    total = -sum(forward_logprob_sums(tc, data, per_request))
    return total / max(1.0, sum(datum_weight(d) for d in data))


def supervised_schedule(cfg: Any, n_train: int) -> Iterator[tuple[int, list[int], bool]]:
    """The steps of supervised_loop over n_train training items: (step, the indices of its
    batch, whether it measures the eval loss after training). Each step takes cfg.batch_size
    indices from a fresh shuffle from cfg.seed each pass; the eval loss is measured on the
    first and last steps and every cfg.eval_every steps. Recipes' cost estimates walk the
    same schedule."""
    rng = random.Random(cfg.seed)
    order: list[int] = []
    for step in range(1, cfg.steps + 1):
        if len(order) < cfg.batch_size:
            more = list(range(n_train))
            rng.shuffle(more)
            order += more
        batch = order[:cfg.batch_size]
        del order[:cfg.batch_size]
        yield step, batch, step == 1 or step == cfg.steps or (cfg.eval_every > 0 and step % cfg.eval_every == 0)


def supervised_loop(run: Run, cfg: Any, train_data: Sequence[types.Datum], eval_data: Sequence[types.Datum],
                    per_request: int | None = None) -> dict:
    """Supervised training with a held-out loss: each step trains on cfg.batch_size datums
    (cross_entropy; the order is a fresh shuffle from cfg.seed each pass), and the per-token
    NLL of eval_data is measured with `forward` at the start, on the first and last steps and
    every cfg.eval_every steps (in forward requests of at most per_request datums). Logs a metrics row per step (train_loss, tokens, eval_loss) and
    saves every cfg.save_every steps; returns the run's summary so far (the caller finishes
    the run)."""
    start = 0
    if (state := run.resumed) is not None and state.get("phase") == "sft":  # continue after its step
        start, first_eval, eval_loss = state["step"], state["eval_loss_start"], state["eval_loss"]
    else:
        first_eval = mean_nll(run.training, eval_data, per_request)
        eval_loss = first_eval

    def loop_state() -> dict:
        # the schedule is replayed from cfg.seed on resume, so the step is all it needs
        return {"phase": "sft", "step": step, "eval_loss_start": first_eval, "eval_loss": eval_loss}

    for step, picked, evaluates in supervised_schedule(cfg, len(train_data)):
        if step <= start:
            continue
        batch = [train_data[i] for i in picked]
        fb = run.training.forward_backward(batch, "cross_entropy").result()
        tokens = sum(datum_weight(d) for d in batch)
        train_loss = float(fb.metrics["loss:sum"]) / max(1.0, tokens)
        run.optim_step()
        row = {"train_loss": train_loss, "tokens": tokens}
        if evaluates:
            eval_loss = mean_nll(run.training, eval_data, per_request)
            row["eval_loss"] = eval_loss
        if step == 1:
            row["eval_loss_start"] = first_eval
        run.log(step, **row)
        run.maybe_save(step, loop_state)
    return {"run_id": run.run_id, "eval_loss_start": first_eval, "eval_loss_end": eval_loss,
            "log_dir": str(run.log_dir)}
