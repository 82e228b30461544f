"""The audit log (AdminClient.get_audit_log) and checkpoint storage
(AdminClient.get_current_checkpoint_storage_usage, `tinker billing checkpoint-storage`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import tinker

from e2e_helpers import BASE_MODEL, result, sft_batch, train_step


@pytest.fixture(scope="module")
def admin_client(loops_url: str):
    return tinker.AdminClient()


@pytest.fixture(scope="module")
def saved(service_client, tokenizer):
    tc = result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=4))
    train_step(tc, sft_batch(tokenizer), lr=1e-3)
    tag = uuid.uuid4().hex[:6]
    state = result(tc.save_state(f"audit-{tag}"))
    return tc, state.path


def _all_checkpoints(rest_client):
    out, offset = [], 0
    while True:
        page = result(rest_client.list_user_checkpoints(limit=100, offset=offset))
        out.extend(page.checkpoints)
        if not page.checkpoints or page.cursor is None or offset + len(page.checkpoints) >= page.cursor.total_count:
            return out
        offset += len(page.checkpoints)


def test_checkpoint_storage_is_the_sum_of_the_checkpoints(admin_client, rest_client, saved):
    usage = result(admin_client.get_current_checkpoint_storage_usage())
    assert len(usage.data) == 1
    row = usage.data[0]
    cks = _all_checkpoints(rest_client)
    assert row.checkpoint_count == len(cks) >= 1
    want = sum(c.size_bytes or 0 for c in cks)
    assert want > 0
    assert row.size_bytes == want
    assert row.size_gigabytes == pytest.approx(want / 1e9)
    assert usage.effective_rate_usd_per_gigabyte_month is None


def test_checkpoint_storage_project_filter_is_refused(admin_client, saved):
    with pytest.raises(tinker.BadRequestError) as e:
        result(admin_client.get_current_checkpoint_storage_usage(project_id="some-project"))
    assert "project_id" in str(e.value)


def test_tinker_cli_checkpoint_storage(loops_url: str, rest_client, saved):
    cli = Path(sys.executable).with_name("tinker")
    env = dict(os.environ, TINKER_BASE_URL=loops_url)
    proc = subprocess.run([str(cli), "--format", "json", "billing", "checkpoint-storage"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    cks = _all_checkpoints(rest_client)
    assert out["data"][0]["checkpoint_count"] == len(cks)
    assert out["data"][0]["size_bytes"] == sum(c.size_bytes or 0 for c in cks)


def test_audit_log_records_the_calls(admin_client, rest_client, saved):
    tc, path = saved
    entries = result(admin_client.get_audit_log()).entries
    events = [(e.event, e.event_details.get("target")) for e in entries]
    assert ("training_run_create", tc.model_id) in events, events
    assert ("training_run_optim_step", tc.model_id) in events, events
    assert ("checkpoint_create", tc.model_id) in events, events
    assert all(e.event_details["key_id"].startswith("key-") for e in entries)
    assert all(e.event_details["client_addr"] for e in entries)
    assert [e.timestamp for e in entries] == sorted(e.timestamp for e in entries)

    # A checkpoint delete is a checkpoint event with its tinker path; event_type filters.
    result(rest_client.delete_checkpoint_from_tinker_path(path))
    cks = result(admin_client.get_audit_log(event_type="checkpoints")).entries
    assert cks and all(e.event.startswith("checkpoint_") for e in cks)
    deletes = [e for e in cks if e.event == "checkpoint_delete"]
    assert deletes and deletes[-1].tinker_path == path
    assert deletes[-1].event_details["code"] == "ok"
    assert deletes[-1].event_details["status"] == 200

    # Reads are not recorded.
    assert not any(e.event.startswith("checkpoint_list") for e in entries)


def test_audit_log_of_another_day_is_empty(admin_client, saved):
    from datetime import date
    assert result(admin_client.get_audit_log(day=date(2001, 1, 1))).entries == []
