"""LoRA adapters over real processes and HTTP: `--lora-modules` at start, `model: <adapter>` in both
OpenAI endpoints, /v1/models listing adapters with their parent, and load/unload behind the admin
token with clear refusals. Tokens are checked against the in-process LLM with the same adapters."""

from __future__ import annotations

import re
import shutil

import httpx
import pytest
from harness.api_server import ApiServer, with_chat_template
from harness.deployment import start
from harness.lora_adapters import make_peft_adapter

from pagedserve import LLM, SamplingParams

ADMIN = "admin-secret"
PROMPTS = [[5, 9, 77, 31, 8, 40, 41, 42, 43, 44], [100, 3, 45]]


@pytest.fixture(scope="module")
def lora_deployment(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-api")
    base = with_chat_template(shutil.copytree(tiny_model("llama"), root / "tiny-lora-base"))
    adapters = {
        n: make_peft_adapter(base, root / n, seed=i, rank=4) for i, n in enumerate(("sql", "chat", "late"))
    }
    adapters["wide"] = make_peft_adapter(tiny_model("llama", hidden_size=32), root / "wide", rank=2)
    logs = tmp_path_factory.mktemp("lora-api-logs")
    sup = start(
        base,
        workers=1,
        log_dir=logs,
        max_loras=2,
        admin_token=ADMIN,
        lora_modules=[f"sql={adapters['sql']}", f"chat={adapters['chat']}"],
    )
    api = ApiServer(sup.config, logs / "api.log", "--max-loras", "2", "--admin-token", ADMIN)
    try:
        api.wait_healthy()
        yield api, base, adapters, sup
    finally:
        api.stop()
        sup.stop()


def _completion(api: ApiServer, model: str, prompt: list[int]) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    return httpx.post(f"{api.base_url}/completions", json=body, timeout=60)


def test_adapters_by_model_name_listing_and_admin_load_unload(lora_deployment):
    api, base, adapters, sup = lora_deployment
    base_name = base.name
    models = httpx.get(f"{api.base_url}/models", timeout=10).json()["data"]
    assert [(m["id"], m["parent"]) for m in models] == [
        (base_name, None),
        ("chat", base_name),
        ("sql", base_name),
    ]

    llm = LLM(
        str(base),
        num_blocks=64,
        max_loras=2,
        lora_modules={k: str(adapters[k]) for k in ("sql", "chat", "late")},
    )
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for model in ("sql", "chat", base_name):
        got = [c["text"] for c in _completion(api, model, PROMPTS[0]).json()["choices"]]
        want = llm.generate([PROMPTS[0]], greedy, lora=None if model == base_name else model)[0].text
        assert got == [want], model
    assert (
        len(
            {_completion(api, m, PROMPTS[0]).json()["choices"][0]["text"] for m in ("sql", "chat", base_name)}
        )
        == 3
    )
    chat = httpx.post(
        f"{api.base_url}/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=60,
    )
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"] is not None, chat.text

    missing = _completion(api, "late", PROMPTS[1])
    assert (
        missing.status_code == 404
        and "'late' is neither the base model nor a loaded LoRA adapter" in missing.text
    )

    load = {"lora_name": "late", "lora_path": str(adapters["late"])}
    assert httpx.post(f"{api.base_url}/load_lora_adapter", json=load, timeout=10).status_code == 403
    wrong = httpx.post(
        f"{api.base_url}/load_lora_adapter", json=load, headers={"x-admin-token": "no"}, timeout=10
    )
    assert wrong.status_code == 403
    admin = {"x-admin-token": ADMIN}
    bad_path = {"lora_name": "x", "lora_path": str(base)}  # the base checkpoint: no adapter_config.json
    refused = httpx.post(f"{api.base_url}/load_lora_adapter", json=bad_path, headers=admin, timeout=10)
    assert refused.status_code == 400 and "no adapter_config.json" in refused.text
    wide = {"lora_name": "wide", "lora_path": str(adapters["wide"])}  # made for a model of hidden size 32
    refused = httpx.post(f"{api.base_url}/load_lora_adapter", json=wide, headers=admin, timeout=10)
    assert refused.status_code == 400
    shape = r"module model\.layers\.\d+\.\w+\.\w+ lora_[AB] has shape \[\d+, \d+\]; the base model needs"
    assert re.search(shape, refused.text), refused.text
    loaded = httpx.post(f"{api.base_url}/load_lora_adapter", json=load, headers=admin, timeout=10)
    assert loaded.status_code == 200, loaded.text
    got = _completion(api, "late", PROMPTS[1]).json()["choices"][0]["text"]
    assert got == llm.generate([PROMPTS[1]], greedy, lora="late")[0].text
    again = httpx.post(f"{api.base_url}/load_lora_adapter", json=load, headers=admin, timeout=10)
    assert again.status_code == 400 and "already loaded" in again.text

    # In use: refused with the request named, while it streams on.
    body = {"model": "late", "prompt": PROMPTS[1], "max_tokens": 480, "ignore_eos": True, "stream": True}
    headers = {**admin, "x-request-id": "long-late"}
    with httpx.stream("POST", f"{api.base_url}/completions", json=body, headers=headers, timeout=60) as live:
        lines = live.iter_lines()  # kept: a dropped iterator closes the response (a disconnect)
        next(lines)
        busy = httpx.post(
            f"{api.base_url}/unload_lora_adapter", json={"lora_name": "late"}, headers=admin, timeout=10
        )
        # The live view's data (the page at /view polls it) names the request's adapter, and the
        # adapters, their per-step count and the workers' loads.
        view = httpx.get(
            f"http://127.0.0.1:{sup.config.scheduler_ops_port}/view/sched",
            headers={"Authorization": f"Bearer {ADMIN}"},
            timeout=10,
        ).json()
    listed = {r["request_id"]: r["lora"] for r in view["requests"]}  # the API's id plus its own suffix
    assert [lora for rid, lora in listed.items() if rid.startswith("cmpl-long-late")] == ["late"], listed
    lora = view["lora"]
    assert lora["enabled"] and lora["adapters"] == ["chat", "late", "sql"], lora
    assert lora["adapters_last_step"] >= 1 and lora["worker_loads"] >= 1 and lora["worker_load_s"] > 0, lora
    assert busy.status_code == 409 and "in use by running requests: cmpl-long-late" in busy.text, busy.text
    unload = httpx.post(
        f"{api.base_url}/unload_lora_adapter", json={"lora_name": "late"}, headers=admin, timeout=10
    )
    assert unload.status_code == 200, unload.text
    assert _completion(api, "late", PROMPTS[1]).status_code == 404
    gone = httpx.post(
        f"{api.base_url}/unload_lora_adapter", json={"lora_name": "late"}, headers=admin, timeout=10
    )
    assert gone.status_code == 404 and "'late' is not loaded" in gone.text
    # The base and the other adapters are untouched by all of that.
    assert (
        _completion(api, "sql", PROMPTS[0]).json()["choices"][0]["text"]
        == llm.generate([PROMPTS[0]], greedy, lora="sql")[0].text
    )
    metrics = httpx.get(f"http://127.0.0.1:{sup.config.scheduler_ops_port}/metrics", timeout=10).text
    assert 'pagedserve_lora_admin_total{action="load",outcome="refused"} 3.0' in metrics
    assert 'pagedserve_lora_admin_total{action="unload",outcome="in_use"} 1.0' in metrics
    assert "pagedserve_lora_adapters_loaded 2.0" in metrics
    steps_with_adapters = re.search(r'pagedserve_lora_adapters_per_step_bucket\{le="0.0"\} (\S+)', metrics)
    total = re.search(r"^pagedserve_lora_adapters_per_step_count (\S+)", metrics, re.M)
    assert steps_with_adapters and total and float(total.group(1)) > float(steps_with_adapters.group(1)) > 0
    assert float(re.search(r"^pagedserve_lora_worker_loads_total (\S+)", metrics, re.M).group(1)) >= 1
