"""`--dtype auto` on a CPU: the rule per CPU kind, the probe and its cache, and the start log's reason."""

from __future__ import annotations

import json

import pytest

from pagedserve.kernels.cpu.isa import ISA_ENV
from pagedserve.services.worker import auto_dtype
from pagedserve.services.worker.auto_dtype import BF16_MARGIN, GemmProbe, choose_cpu_dtype
from pagedserve.services.worker.weights.loader import resolve_dtype

AVX512 = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c"})
ZEN4 = AVX512 | {"avx512_bf16", "avx512_vnni"}
SAPPHIRE_RAPIDS = ZEN4 | {"amx_bf16", "amx_tile", "amx_int8"}
ZEN3 = frozenset({"avx2", "fma", "f16c"})


@pytest.fixture
def default_logging():
    """structlog at its defaults for one test (another test may have set a level filter)."""
    import structlog

    saved = structlog.get_config()
    structlog.reset_defaults()
    yield
    structlog.configure(**saved)


def never_probed() -> tuple[GemmProbe, str]:
    raise AssertionError("the flags decide this CPU kind; the probe must not run")


def probed(ratio: float):
    return lambda: (GemmProbe(1.0, ratio), "probe for the test")


@pytest.mark.parametrize(
    ("flags", "forced", "dtype", "reason"),
    [
        (SAPPHIRE_RAPIDS, None, "bfloat16", "AMX-bf16"),
        (SAPPHIRE_RAPIDS, "avx2", "float32", f"{ISA_ENV}=avx2 hides AVX-512"),
        (ZEN4, "portable", "float32", f"{ISA_ENV}=portable hides AVX-512"),
        (AVX512, None, "float32", "neither AMX-bf16 nor AVX512-BF16"),
        (ZEN3, None, "float32", "neither AMX-bf16 nor AVX512-BF16"),
        (frozenset(), None, "float32", "neither AMX-bf16 nor AVX512-BF16"),
    ],
)
def test_the_flags_decide_where_the_measurements_leave_no_doubt(flags, forced, dtype, reason):
    choice = choose_cpu_dtype(flags, forced, never_probed)
    assert choice.dtype == dtype and reason in choice.reason


@pytest.mark.parametrize(
    ("ratio", "dtype"), [(0.47, "bfloat16"), (BF16_MARGIN, "bfloat16"), (0.9, "float32"), (1.6, "float32")]
)
def test_avx512_bf16_without_amx_goes_by_the_probe(ratio, dtype):
    """Zen 4 measured 0.47-0.53 (bfloat16 picked); a CPU where bf16 GEMMs are not clearly faster keeps
    float32, and the reason gives the measured ratio and where it came from."""
    choice = choose_cpu_dtype(ZEN4, None, probed(ratio))
    assert choice.dtype == dtype
    assert f"{ratio:.2f}x float32's time" in choice.reason and "probe for the test" in choice.reason


def test_the_probe_is_cached_per_machine_and_a_broken_cache_is_probed_again(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path))
    runs: list[GemmProbe] = []

    def fake_probe() -> GemmProbe:  # the real probe is timed in test_auto_matches_this_cpu_probe
        runs.append(GemmProbe(2.0, 1.0))
        return runs[-1]

    monkeypatch.setattr(auto_dtype, "probe_gemms", fake_probe)
    first, source = auto_dtype.cached_probe()
    assert "probed now, cached in" in source and len(runs) == 1
    path = auto_dtype.probe_cache_file()
    assert json.loads(path.read_text()) == {"float32_s": 2.0, "bfloat16_s": 1.0}
    again, source = auto_dtype.cached_probe()
    assert again == first and "probe cached in" in source and len(runs) == 1
    path.write_text("{not json")
    auto_dtype.cached_probe()
    assert len(runs) == 2 and json.loads(path.read_text())["float32_s"] == 2.0


def test_the_real_probe_times_both_dtypes():
    timings = auto_dtype.probe_gemms(repeats=1)
    assert timings.float32_s > 0 and timings.bfloat16_s > 0


def test_auto_follows_the_rule_on_each_isa_path_and_logs_why(isa, tmp_path, monkeypatch, default_logging):
    """Each ISA path this CPU runs, forced as a user would: the choice is the rule's for this CPU's
    flags (on an AVX512-BF16 CPU without AMX, the real probe's), and the start log says why."""
    from structlog.testing import capture_logs

    monkeypatch.setenv(ISA_ENV, isa)
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path))
    expected = auto_dtype.auto_cpu_dtype()  # probes (on such a CPU) and caches
    with capture_logs() as logs:
        chosen = resolve_dtype("auto", "cpu")
    assert chosen == expected.dtype
    (line,) = [e for e in logs if e["event"] == "dtype auto"]
    assert line["chose"] == chosen and line["reason"]
    if isa in ("avx2", "portable"):
        assert chosen == "float32" and f"{ISA_ENV}={isa}" in line["reason"]
    flags = auto_dtype.cpu_flags()
    if isa == "avx512" and "avx512_bf16" in flags and "amx_bf16" not in flags:
        assert "probe cached in" in line["reason"]
