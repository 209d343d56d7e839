"""A .gguf file is a model: services/checkpoint.py reads its config, limits, EOS ids and tokenizer from
the metadata alone (without torch), finds it in a folder, joins a split set, and names the file and
the problem for a truncated or corrupt file, an unknown architecture or a missing part."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import pytest
from harness.gguf_models import CHAT_TEMPLATE, rewrite_gguf, write_gguf
from harness.tiny_models import make_tiny_model

from pagedserve.services.checkpoint import load_checkpoint, load_tokenizer, resolve_model, served_name
from pagedserve.services.gguf_config import GGUF_ARCHITECTURES
from pagedserve.services.gguf_file import GGUFError
from pagedserve.services.gguf_tokenizer import derive_tokenizer

# The fields every service and the worker's registry read; the rest of config.json is transformers'.
FIELDS = (
    "architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "max_position_embeddings",
    "tie_word_embeddings",
)  # fmt: skip


def rope_theta(config: dict) -> float:
    return (config.get("rope_parameters") or {}).get("rope_theta") or config.get("rope_theta") or 10000.0


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """arch -> (its checkpoint folder, the same model as one .gguf file), written once."""
    root = tmp_path_factory.mktemp("gguf")
    out = {}
    for arch, kind in (
        ("llama", "Q8_0"), ("qwen2", "F32"), ("qwen3", "F16"), ("mistral", "Q4_0"),
        ("qwen2_moe", "Q8_0"), ("qwen3_moe", "F32"), ("mixtral", "F32"), ("olmoe", "F16"),
    ):  # fmt: skip
        folder = make_tiny_model(arch, root / arch)
        out[arch] = folder, write_gguf(folder, root / f"{arch}.gguf", kind)
    return out


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def sparse_layers(config: dict) -> list[int]:
    """The layers a MoE config makes sparse (transformers' rule for the Qwen MoE models)."""
    step, dense = config.get("decoder_sparse_step", 1), config.get("mlp_only_layers", [])
    return [i for i in range(config["num_hidden_layers"]) if i not in dense and (i + 1) % step == 0]


@pytest.mark.parametrize("arch", ["qwen2_moe", "qwen3_moe"])
def test_a_mixture_of_experts_file_reads_as_its_folder_does(models, arch: str) -> None:
    """Its experts, the shared expert's size and which layers are sparse (from the routers the file
    holds: these tiny models have dense layers too, which llama.cpp's own files never have)."""
    folder, file = models[arch]
    from_folder, from_file = load_checkpoint(str(folder)).config, load_checkpoint(str(file)).config
    for name in (*FIELDS, "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob"):
        assert from_file.get(name) == pytest.approx(from_folder.get(name)), name
    # transformers writes either name for the expert count (its configs' attribute_map); the registry reads both
    assert from_file["num_experts"] == from_folder.get("num_experts", from_folder.get("num_local_experts"))
    assert from_file.get("shared_expert_intermediate_size") == from_folder.get(
        "shared_expert_intermediate_size"
    )
    assert (
        sparse_layers(from_file) == sparse_layers(from_folder) != list(range(from_file["num_hidden_layers"]))
    )


@pytest.mark.parametrize("arch", ["mixtral", "olmoe"])
def test_a_mixtral_or_olmoe_file_reads_as_its_folder_does(models, arch: str) -> None:
    """Mixtral is written under llama.cpp's `llama` architecture, told apart by its experts; OLMoE under
    `olmoe`, with its whole-projection q/k norms and its clip_qkv where the file states one."""
    folder, file = models[arch]
    from_folder, from_file = load_checkpoint(str(folder)).config, load_checkpoint(str(file)).config
    assert from_file["architectures"] == from_folder["architectures"]
    assert from_file["model_type"] == from_folder["model_type"]
    for name in (*FIELDS, "num_experts_per_tok", "intermediate_size", "clip_qkv"):
        assert from_file.get(name) == pytest.approx(from_folder.get(name)), name
    experts = from_folder.get("num_local_experts", from_folder.get("num_experts"))
    assert from_file.get("num_local_experts", from_file.get("num_experts")) == experts
    assert from_file.get("norm_topk_prob", False) == from_folder.get("norm_topk_prob", False)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_the_file_reads_as_the_folder_does(models, arch: str) -> None:
    folder, file = models[arch]
    from_folder, from_file = load_checkpoint(str(folder)), load_checkpoint(str(file))
    # llama.cpp writes a Mistral model as a `llama` one: the same model class serves both.
    if arch == "mistral":
        from_folder.config["architectures"] = ["LlamaForCausalLM"]
    for name in FIELDS:
        assert from_file.config.get(name) == pytest.approx(from_folder.config.get(name)), name
    head_dim = (
        from_folder.config.get("head_dim")
        or from_folder.config["hidden_size"] // from_folder.config["num_attention_heads"]
    )
    assert from_file.config["head_dim"] == head_dim
    assert rope_theta(from_file.config) == rope_theta(from_folder.config)
    assert (from_file.vocab_size, from_file.max_model_len, from_file.eos_token_ids) == (
        from_folder.vocab_size,
        from_folder.max_model_len,
        from_folder.eos_token_ids,
    )
    assert from_file.gguf_files == (file,) and from_file.tokenizer_path == file


def test_reading_a_gguf_imports_no_torch(models) -> None:
    _, file = models["qwen3"]
    code = (
        "import sys; from pagedserve.services.checkpoint import load_checkpoint; "
        f"c = load_checkpoint({str(file)!r}); print(c.architecture, c.max_model_len, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["Qwen3ForCausalLM", "512", "False"]


def test_the_tokenizer_and_chat_template_come_from_the_file_and_are_cached(models, own_cache: Path) -> None:
    from transformers import AutoTokenizer

    folder, file = models["llama"]
    derived = load_tokenizer(load_checkpoint(str(file)).tokenizer_path)
    cached = list((own_cache / "gguf-tokenizers").iterdir())
    assert [p.name.split("-")[0] for p in cached] == ["llama"]
    again = load_tokenizer(file)  # from the cache this time
    reference = AutoTokenizer.from_pretrained(folder)  # the folder's tokenizer, template written beside
    transformers_own = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    text = "Hello wörld\n\n  twice <s>"
    assert derived(text).input_ids == again(text).input_ids == reference(text).input_ids
    assert derived(text).input_ids == transformers_own(text).input_ids
    messages = [{"role": "user", "content": "Hi"}]
    assert derived.chat_template == again.chat_template == CHAT_TEMPLATE
    chat = derived.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert (derived.eos_token, derived.bos_token) == (reference.eos_token, reference.bos_token)


def test_padding_tokens_decode_to_nothing_as_in_the_folder(models) -> None:
    # The vocabulary is padded to the embedding's 320 rows with unused `[PAD283]`-style tokens, which
    # the folder's tokenizer has no entry for (and llama.cpp prints as nothing).
    folder, file = models["llama"]
    derived = load_tokenizer(file)
    reference = load_tokenizer(folder)
    assert derived.decode([283, 40, 300]) == reference.decode([283, 40, 300]) == reference.decode([40])
    assert derived("[PAD283]").input_ids == reference("[PAD283]").input_ids


def test_a_folder_holding_one_gguf_and_no_config_is_that_gguf(models, tmp_path: Path) -> None:
    _, file = models["llama"]
    holder = tmp_path / "holder"
    holder.mkdir()
    shutil.copy(file, holder / "m.gguf")
    (holder / "mmproj-m.gguf").write_bytes(b"a projector, not the model")
    assert resolve_model(str(holder)) == holder / "m.gguf"
    shutil.copy(file, holder / "other.gguf")
    with pytest.raises(ValueError, match=r"holds 2 GGUF models and no config.json .*pass the file itself"):
        resolve_model(str(holder))


def test_the_served_name_is_the_file_name_without_its_suffix_or_part_number() -> None:
    assert served_name("/models/Qwen3-8B-Q4_K_M.gguf") == "Qwen3-8B-Q4_K_M"
    assert served_name("/models/big-00001-of-00003.gguf") == "big"
    assert served_name("/models/folder") == "folder"
    assert served_name("smollm2-135m") == "smollm2-135m"


def test_a_split_set_is_one_model_and_a_missing_part_is_named(models, tmp_path: Path) -> None:
    folder, single = models["qwen2"]
    first = write_gguf(folder, tmp_path / "split.gguf", "F32", split_max_tensors=10)
    parts = sorted(tmp_path.glob("split-*.gguf"))
    assert len(parts) > 2 and first == parts[0]
    checkpoint = load_checkpoint(str(parts[1]))  # any part names the set
    assert checkpoint.gguf_files == tuple(parts) and checkpoint.path == first
    assert checkpoint.config == load_checkpoint(str(single)).config
    parts[1].unlink()
    with pytest.raises(
        GGUFError, match=rf"split set of {len(parts)} files, and 1 are missing .*{parts[1].name}"
    ):
        load_checkpoint(str(first))


def test_a_truncated_file_is_named_with_what_is_cut(models, tmp_path: Path) -> None:
    _, file = models["llama"]
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(file.read_bytes()[: file.stat().st_size - 100])
    with pytest.raises(
        GGUFError, match=rf"{cut} is truncated: tensor '.*' needs bytes .*interrupted download"
    ):
        load_checkpoint(str(cut))
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(file.read_bytes()[:300])
    with pytest.raises(GGUFError, match=rf"{header_only} is corrupt or truncated: .*runs past the end"):
        load_checkpoint(str(header_only))


def test_a_file_that_is_not_a_gguf_is_named(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"<html>404 Not Found</html>" * 4)
    with pytest.raises(GGUFError, match=rf"{bogus} is not a GGUF file: it starts with b'<htm'"):
        load_checkpoint(str(bogus))


def test_an_unknown_architecture_is_named_with_the_supported_ones(tmp_path: Path) -> None:
    path = tmp_path / "mamba.gguf"
    writer = gguf.GGUFWriter(path, "mamba")
    writer.add_block_count(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    supported = ", ".join(GGUF_ARCHITECTURES)
    with pytest.raises(
        GGUFError, match=rf"{path}: architecture 'mamba' .* not supported; supported: {supported}"
    ):
        load_checkpoint(str(path))


def test_a_missing_file_and_a_tokenizer_folder_without_tokenizer_are_clear_errors(
    models, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="no such file"):
        resolve_model(str(tmp_path / "absent.gguf"))
    _, file = models["llama"]
    with pytest.raises(ValueError, match=r"tokenizer '.*' is not a folder holding tokenizer.json"):
        load_checkpoint(str(file), tokenizer=str(tmp_path))


def test_tokenizer_overrides_the_files_own(models) -> None:
    folder, file = models["qwen3"]
    assert load_checkpoint(str(file), tokenizer=str(folder)).tokenizer_path == folder


def test_metadata_the_model_needs_is_named_with_the_file_when_missing_or_wrong(
    models, tmp_path: Path
) -> None:
    _, file = models["llama"]
    no_layers = rewrite_gguf(file, tmp_path / "no-layers.gguf", drop=("llama.block_count",))
    with pytest.raises(GGUFError, match=rf"{no_layers} lacks metadata the model needs: llama.block_count"):
        load_checkpoint(str(no_layers))
    wrong = rewrite_gguf(file, tmp_path / "wrong.gguf", metadata={"llama.embedding_length": "sixty-four"})
    with pytest.raises(
        GGUFError, match=rf"{wrong}: llama.embedding_length is 'sixty-four'; expected a positive integer"
    ):
        load_checkpoint(str(wrong))
    zero_eps = rewrite_gguf(
        file, tmp_path / "eps.gguf", metadata={"llama.attention.layer_norm_rms_epsilon": 0.0}
    )
    with pytest.raises(GGUFError, match=rf"{zero_eps}: llama.attention.layer_norm_rms_epsilon is 0.0"):
        load_checkpoint(str(zero_eps))
    per_layer = rewrite_gguf(
        file, tmp_path / "per-layer.gguf", metadata={"llama.attention.head_count_kv": [2, 1, 2]}
    )
    with pytest.raises(GGUFError, match=rf"{per_layer}: llama.attention.head_count_kv differs per layer"):
        load_checkpoint(str(per_layer))


def test_a_file_without_a_tokenizer_has_none_and_deriving_one_says_to_pass_one(
    models, tmp_path: Path
) -> None:
    folder, file = models["qwen2"]
    bare = rewrite_gguf(file, tmp_path / "bare.gguf", drop=("tokenizer.ggml.model",))
    # As a folder without tokenizer files: served on token ids alone.
    assert load_checkpoint(str(bare)).tokenizer_path is None
    with pytest.raises(GGUFError, match=rf"{bare} carries no tokenizer .*pass --tokenizer FOLDER"):
        derive_tokenizer(bare)
    assert load_checkpoint(str(bare), tokenizer=str(folder)).tokenizer_path == folder
