"""The keys file: name -> key, every problem refused with the file named (services/api/api_keys.py)."""

from __future__ import annotations

import pytest

from pagedserve.services.api.api_keys import KeysFileError, key_owner, load_api_keys


def test_toml_and_json_files_give_the_same_names(tmp_path):
    (tmp_path / "k.toml").write_text('alice = "sk-alice-123"\n"batch-jobs" = "sk-batch-123"\n')
    (tmp_path / "k.json").write_text('{"alice": "sk-alice-123", "batch-jobs": "sk-batch-123"}')
    keys = load_api_keys(tmp_path / "k.toml")
    assert (
        keys == load_api_keys(tmp_path / "k.json") == {"alice": "sk-alice-123", "batch-jobs": "sk-batch-123"}
    )
    assert key_owner(keys, "sk-batch-123") == "batch-jobs"
    assert key_owner(keys, "sk-batch-12") is None


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("k.toml", "alice = ", "not valid TOML"),
        ("k.json", "{alice", "not valid JSON"),
        ("k.json", "[]", "want a table"),
        ("k.toml", "", "want a table"),
        ("k.toml", "alice = 7", "'alice' must be a string of 8+ characters"),
        ("k.toml", 'alice = "short"', "'alice' must be a string of 8+ characters"),
        ("k.toml", 'a = "sk-same-key"\nb = "sk-same-key"', "'a' and 'b' have the same key"),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_the_problem(tmp_path, name, text, words):
    (tmp_path / name).write_text(text)
    with pytest.raises(KeysFileError) as caught:
        load_api_keys(tmp_path / name)
    assert str(tmp_path / name) in str(caught.value) and words in str(caught.value)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(KeysFileError, match="cannot be read"):
        load_api_keys(tmp_path / "nowhere.toml")
