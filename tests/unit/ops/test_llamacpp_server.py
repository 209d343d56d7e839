"""The llama.cpp server peer of `bench serve` without llama.cpp: its command line, the body fields that
stand in for ignore_eos, the comparison of two reports, and the start/wait/stop of a real process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pagedserve.ops.bench.llamacpp_server import (
    compare,
    llama_server_argv,
    llama_server_binary,
    request_extras,
    running_server,
    server_argv,
    write_compare_chart,
)


def test_server_argv_names_the_gguf_threads_and_keeps_streams_uninterrupted() -> None:
    argv = server_argv(Path("/v/bin/python"), Path("/m/x.Q8_0.gguf"), 8012, 2, 4096)
    assert argv[:3] == ["/v/bin/python", "-m", "llama_cpp.server"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert flags["--model"] == "/m/x.Q8_0.gguf"
    assert (flags["--port"], flags["--n_threads"], flags["--n_threads_batch"]) == ("8012", "2", "2")
    assert flags["--n_ctx"] == "4096"
    assert flags["--interrupt_requests"] == "False"  # else a queued request cuts the streaming one


def test_llama_server_argv_gives_each_slot_its_own_kv_stream_and_the_whole_context() -> None:
    argv = llama_server_argv(Path("/v/bin/llama-server"), Path("/m/x.gguf"), 8012, 2, 768, 64)
    assert argv[0] == "/v/bin/llama-server"
    assert argv[-3:] == ["--no-kv-unified", "--cont-batching", "--no-webui"]
    flags = dict(zip(argv[1:-3:2], argv[2:-3:2], strict=True))
    assert flags["--model"] == "/m/x.gguf"
    assert (flags["--host"], flags["--port"]) == ("127.0.0.1", "8012")
    assert (flags["--threads"], flags["--threads-batch"]) == ("2", "2")
    # --ctx-size is shared out among the slots: 64 slots of 768 tokens.
    assert (flags["--parallel"], flags["--ctx-size"]) == ("64", str(64 * 768))


def test_llama_server_is_used_only_where_the_venv_has_it(tmp_path: Path) -> None:
    assert llama_server_binary(tmp_path) is None
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-server").write_text("")
    assert llama_server_binary(tmp_path) == tmp_path / "bin" / "llama-server"


def test_eos_is_biased_away_for_every_eos_id() -> None:
    assert request_extras([2, 7]) == {"logit_bias": {"2": -100.0, "7": -100.0}}


def _report(rates_tok_tpot: list[tuple[object, float, float | None]]) -> dict:
    return {
        "runs": [
            {"request_rate": rate, "output_throughput": tok, "tpot_ms": {"p50": tpot, "p99": tpot}}
            for rate, tok, tpot in rates_tok_tpot
        ]
    }


def test_compare_pairs_runs_by_rate_with_ratios(tmp_path: Path) -> None:
    ours = _report([(1, 30.0, 40.0), (4, 80.0, 50.0), ("inf", 120.0, 90.0)])
    theirs = _report([(1, 25.0, 32.0), ("inf", 60.0, None)])
    rows = compare(ours, theirs)
    assert [r["request_rate"] for r in rows] == [1, "inf"]  # rate 4 has no peer run
    assert rows[0]["pagedserve"] == {"output_tok_s": 30.0, "tpot_p50_ms": 40.0}
    assert rows[0]["llamacpp"] == {"output_tok_s": 25.0, "tpot_p50_ms": 32.0}
    assert (rows[0]["output_ratio"], rows[0]["tpot_p50_ratio"]) == (1.2, 1.25)
    assert (rows[1]["output_ratio"], rows[1]["tpot_p50_ratio"]) == (2.0, None)
    chart = tmp_path / "c.png"
    write_compare_chart(rows, "t", chart)
    assert chart.read_bytes()[:4] == b"\x89PNG"


def test_running_server_waits_for_the_model_list_and_stops_the_process(tmp_path: Path) -> None:
    (tmp_path / "www" / "v1").mkdir(parents=True)
    (tmp_path / "www" / "v1" / "models").write_text('{"data": [{"id": "m"}]}')
    argv = [sys.executable, "-m", "http.server", "8765", "--bind", "127.0.0.1", "-d", str(tmp_path / "www")]
    import httpx

    with running_server(argv, "http://127.0.0.1:8765/v1", tmp_path / "log", timeout_s=60):
        assert httpx.get("http://127.0.0.1:8765/v1/models").json()["data"][0]["id"] == "m"
    with pytest.raises(httpx.ConnectError):
        httpx.get("http://127.0.0.1:8765/v1/models", timeout=2)


def test_a_server_that_dies_at_start_is_an_error_with_its_output(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('no such model'); sys.exit(3)"]
    with pytest.raises(RuntimeError, match="exited 3 before serving:\n.*no such model"):
        running_server(argv, "http://127.0.0.1:8766/v1", tmp_path / "log", timeout_s=60).__enter__()
