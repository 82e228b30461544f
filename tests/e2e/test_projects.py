"""Projects and session search with the real SDK: ServiceClient(project_id=..., display_name=...),
RestClient.search_sessions, assign_session_project and list_training_runs(project_id=...)."""

from __future__ import annotations

import uuid
import warnings

import pytest
import tinker
from tinker import types

from e2e_helpers import BASE_MODEL, result


def _search(rest, **kw) -> types.SessionSearchResponse:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # search_sessions is experimental in 0.38.0
        return result(rest.search_sessions(types.SessionSearchRequest(**kw)))


def test_search_sessions_and_move_between_projects(loops_url):
    tag = uuid.uuid4().hex[:8]
    sc = tinker.ServiceClient(project_id=f"p-{tag}", user_metadata={"e2e_search": tag}, display_name=f"Nightly {tag}")
    tc = result(sc.create_lora_training_client(base_model=BASE_MODEL, rank=4))
    rest = tinker.RestClient()

    page = _search(rest, user_metadata={"e2e_search": tag})
    assert len(page.sessions) == 1, page
    found = page.sessions[0]
    assert found.project_id == f"p-{tag}"
    assert found.display_name == f"Nightly {tag}"
    assert found.user_metadata == {"e2e_search": tag}
    assert found.status is not None and found.status.type == "active"
    assert found.owner.startswith("key-")
    assert found.checkpoints_count == 0
    assert page.next_cursor is None
    sid = found.session_id

    assert [s.session_id for s in _search(rest, display_name=f"nightly {tag}").sessions] == [sid]
    assert [s.session_id for s in _search(rest, session_id=sid).sessions] == [sid]
    assert _search(rest, user_metadata={"e2e_search": tag}, statuses=[types.ClientFinishedSessionStatusQuery()]).sessions == []

    # The project filter on runs, then a move: the run goes with its session.
    runs = result(rest.list_training_runs(limit=100, project_id=f"p-{tag}"))
    assert [r.training_run_id for r in runs.training_runs] == [tc.model_id]
    result(rest.assign_session_project(sid, f"q-{tag}"))
    runs = result(rest.list_training_runs(limit=100, project_id=f"q-{tag}"))
    assert [r.training_run_id for r in runs.training_runs] == [tc.model_id]
    assert result(rest.list_training_runs(limit=100, project_id=f"p-{tag}")).training_runs == []
    assert [s.session_id for s in _search(rest, project_ids=[f"q-{tag}"]).sessions] == [sid]

    # A second session with the same metadata: pages of one, newest first, by next_cursor.
    sc2 = tinker.ServiceClient(user_metadata={"e2e_search": tag})
    result(sc2.create_lora_training_client(base_model=BASE_MODEL, rank=4))
    req = types.SessionSearchRequest(user_metadata={"e2e_search": tag}, limit=1)
    first = _search(rest, **req.model_dump(exclude_none=True))
    assert len(first.sessions) == 1 and first.next_cursor is not None
    assert first.sessions[0].project_id == "default"
    second = _search(rest, user_metadata={"e2e_search": tag}, limit=1, cursor=first.next_cursor)
    assert [s.session_id for s in second.sessions] == [sid]

    with pytest.raises(tinker.BadRequestError):
        _search(rest, project_ids=["not a name"])
    with pytest.raises(tinker.NotFoundError):
        _search(rest, project_ids=[f"none-{tag}"])


def test_other_workspace_sees_no_session(loops_url):
    tag = uuid.uuid4().hex[:8]
    sc = tinker.ServiceClient(project_id=f"iso-{tag}", user_metadata={"e2e_iso": tag})
    result(sc.create_lora_training_client(base_model=BASE_MODEL, rank=4))
    sid = _search(tinker.RestClient(), user_metadata={"e2e_iso": tag}).sessions[0].session_id

    other = tinker.RestClient(api_key="tml-e2e-other-workspace")
    assert _search(other, user_metadata={"e2e_iso": tag}, owner=types.AccessibleSearchOwner()).sessions == []
    assert _search(other, session_id=sid, owner=types.AccessibleSearchOwner()).sessions == []
    with pytest.raises(tinker.NotFoundError):
        result(other.assign_session_project(sid, "default"))
    with pytest.raises(tinker.NotFoundError):
        result(other.list_training_runs(project_id=f"iso-{tag}"))
