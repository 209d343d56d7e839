"""`standby_api=1`: a killed API process is replaced by the standby, already built (imports, tokenizer,
chat template), which takes the port, the dead one's log and its scheduler connection; a new standby
starts behind it."""

from __future__ import annotations

import httpx
from harness.deployment import start_with_api, wait_for

from pagedserve.ops.deploy.supervisor import API_STANDBY

PROMPT = {"prompt": "Hi", "max_tokens": 2, "temperature": 0, "ignore_eos": True}


def _logged(path, event: str) -> bool:
    return path.exists() and event in path.read_text()


def _model(base: str) -> str | None:
    try:
        return httpx.get(f"{base}/v1/models", timeout=5).json()["data"][0]["id"]
    except httpx.HTTPError:
        return None


def _answers(base: str, model: str) -> bool:
    try:
        reply = httpx.post(f"{base}/v1/completions", json={**PROMPT, "model": model}, timeout=10)
    except httpx.HTTPError:
        return False
    return reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1


def test_a_killed_api_process_is_replaced_by_the_standby(tiny_model, tmp_path):
    sup, base = start_with_api(tiny_model("llama"), tmp_path, standby_api=1)
    try:
        assert wait_for(lambda: _logged(tmp_path / f"{API_STANDBY}.log", "standby_ready"), 60)
        model = wait_for(lambda: _model(base), 60)
        assert model is not None and _answers(base, model)

        standby = sup.group.standby_pid(API_STANDBY)
        killed = sup.kill("api")
        assert standby is not None and standby != killed
        assert wait_for(lambda: sup.pid("api") == standby, 30), "the standby did not take the API's place"
        assert wait_for(lambda: _answers(base, model), 30)
        api_log = (tmp_path / "api.log").read_text()
        assert "standby_promoted" in api_log and '"promoted_s"' in api_log  # it logs as the API now
        fresh = wait_for(lambda: sup.group.standby_pid(API_STANDBY), 30)
        assert fresh not in (None, standby, killed)  # and another stands by
    finally:
        sup.stop()
