"""Where the C++ kernels are built: a folder keyed by every source and the flags, one per extension."""

from __future__ import annotations

from pagedserve.kernels.cpu.build import LAYER_OPS, PAGED_ATTENTION, Extension, build_dir


def test_each_extension_builds_in_its_own_folder():
    assert build_dir(LAYER_OPS) != build_dir(PAGED_ATTENTION)
    assert build_dir(LAYER_OPS).name.startswith("layer_ops_")


def test_a_change_to_any_source_moves_the_build(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path / "cache"))
    first, second = tmp_path / "a.cpp", tmp_path / "b.cpp"
    first.write_text("int a;")
    second.write_text("int b;")
    extension = Extension("two", (first, second), ("-O3",))
    before = build_dir(extension)
    assert before.parent == tmp_path / "cache" / "kernels"
    second.write_text("int b2;")
    assert build_dir(extension) != before
    second.write_text("int b;")
    assert build_dir(extension) == before


def test_other_flags_move_the_build(tmp_path):
    source = tmp_path / "a.cpp"
    source.write_text("int a;")
    assert build_dir(Extension("x", (source,), ("-O3",))) != build_dir(Extension("x", (source,), ("-O2",)))
