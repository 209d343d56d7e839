"""A GGUF file (or a split set of them) read without torch: its metadata and where each tensor lies.

The scheduler, the API and the workers all read a GGUF model through here (services/checkpoint.py
derives the config, services/gguf_tokenizer.py the tokenizer); the worker then memory-maps the
tensors this finds (services/worker/weights/gguf_weights.py). Nothing here reads tensor data.

Written here rather than with gguf.GGUFReader: that reader makes a numpy view per element of every
metadata array (the tokenizer's ~100K strings), 45 s for the bundled 98 MB file on busy shared cores
of an AMD EPYC, where skipping the arrays nobody asked for takes a fraction of a second. Every read
is bounds-checked: a truncated or corrupt file is a GGUFError naming the file and what is wrong.

A split set (`name-00001-of-00003.gguf`, as llama.cpp's gguf-split writes it) is one model: the
first part holds the metadata, every part holds some of the tensors.
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# GGUF metadata value types -> struct format of a scalar (8 string, 9 array: variable length).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8"}
_NUMPY[12] = "<f8"
_LENGTH = struct.Struct("<Q")  # a string's length prefix: read ~100K times for a vocabulary
_SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


class GGUFError(ValueError):
    """A file that is not a readable GGUF model: the message names the file and the problem."""


@dataclass(frozen=True, slots=True)
class SkippedArray:
    """A metadata array left unread (strings nobody asked for): its length only."""

    item_type: int
    count: int

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # ggml order: dims[0] is the row length (in_features)
    type_id: int  # gguf.GGMLQuantizationType
    file: Path
    start: int  # byte offset of the data in `file`
    nbytes: int

    @property
    def rows(self) -> int:
        return int(np.prod(self.dims[1:])) if len(self.dims) > 1 else 1


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    """One file's header: metadata, tensor table, and its size."""

    path: Path
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    metadata_end: int  # where the tensor table starts: everything before is the metadata
    size: int


@dataclass(frozen=True, slots=True)
class GGUFModel:
    """One model: a file, or every part of a split set, with the first part's metadata."""

    files: tuple[Path, ...]
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]

    @property
    def path(self) -> Path:
        return self.files[0]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_key(self, key: str, default: Any = None) -> Any:
        """`{arch}.<key>`, e.g. arch_key("context_length") for `llama.context_length`."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


def is_gguf_file(path: Path) -> bool:
    return path.suffix == ".gguf" and path.is_file()


def read_header(path: Path, keep_strings: frozenset[str] | set[str] = frozenset()) -> GGUFHeader:
    """Parse one file's metadata and tensor table. String arrays are kept only for the keys in
    `keep_strings` (the tokenizer's), numeric ones always (per-layer values are small)."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                raise GGUFError(f"{path} is not a GGUF file: it holds {size} bytes, fewer than a GGUF header")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as blob:
                return _Parser(path, blob, keep_strings).header()
    except OSError as e:
        raise GGUFError(f"{path} cannot be read: {e}") from e


class _Parser:
    def __init__(self, path: Path, blob: mmap.mmap, keep_strings: frozenset[str] | set[str]) -> None:
        self.path, self.blob, self.keep, self.pos = path, blob, keep_strings, 0

    def fail(self, what: str) -> GGUFError:
        return GGUFError(
            f"{self.path} is corrupt or truncated: {what} (at byte {self.pos} of {len(self.blob)})"
        )

    def take(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.blob):
            raise self.fail("the header runs past the end of the file")
        values = struct.unpack_from("<" + fmt, self.blob, self.pos)
        self.pos += size
        return values[0] if len(values) == 1 else values

    def string(self) -> str:
        if self.pos + 8 > len(self.blob):
            raise self.fail("the header runs past the end of the file")
        (length,) = _LENGTH.unpack_from(self.blob, self.pos)
        start = self.pos + 8
        if start + length > len(self.blob):
            self.pos = start
            raise self.fail(f"a string of {length} bytes runs past the end of the file")
        raw = self.blob[start : start + length]
        self.pos = start + length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"a string is not UTF-8 ({e.reason})") from None

    def value(self, kind: int, keep: bool) -> Any:
        if kind == 8:
            return self.string()
        if kind == 9:
            item_kind, count = self.take("I"), self.take("Q")
            if item_kind in _NUMPY:
                width = np.dtype(_NUMPY[item_kind]).itemsize
                if self.pos + count * width > len(self.blob):
                    raise self.fail(f"an array of {count} values runs past the end of the file")
                values = np.frombuffer(self.blob, _NUMPY[item_kind], count, self.pos).tolist()
                self.pos += count * width
                return values
            if item_kind == 8 and keep:
                return [self.string() for _ in range(count)]
            if item_kind == 8:
                pos, end, unpack = self.pos, len(self.blob), _LENGTH.unpack_from
                for _ in range(count):
                    if pos + 8 > end:
                        break
                    pos += 8 + unpack(self.blob, pos)[0]
                else:
                    if pos <= end:
                        self.pos = pos
                        return SkippedArray(item_kind, count)
                self.pos = min(pos, end)
                raise self.fail("an array of strings runs past the end of the file")
            if item_kind == 9:
                return [self.value(9, keep) for _ in range(count)]
            raise self.fail(f"an array of unknown value type {item_kind}")
        if kind not in _SCALARS:
            raise self.fail(f"a metadata value of unknown type {kind}")
        if kind == 6:  # float32: its shortest decimal form (1e-05, as config.json says, not 9.9999997e-06)
            return float(str(np.float32(self.take("f"))))
        return self.take(_SCALARS[kind])

    def header(self) -> GGUFHeader:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        magic = bytes(self.blob[:4])
        if magic != b"GGUF":
            raise GGUFError(f"{self.path} is not a GGUF file: it starts with {magic!r}, not b'GGUF'")
        self.pos = 4
        version = self.take("I")
        if version not in (2, 3):
            raise GGUFError(f"{self.path} is GGUF version {version}; versions 2 and 3 are read")
        n_tensors, n_kv = self.take("Q"), self.take("Q")
        if n_tensors > len(self.blob) or n_kv > len(self.blob):
            raise self.fail(f"it claims {n_tensors} tensors and {n_kv} metadata keys")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self.string()
            metadata[key] = self.value(self.take("I"), key in self.keep)
        metadata_end = self.pos
        table = []
        for _ in range(n_tensors):
            name = self.string()
            n_dims = self.take("I")
            if n_dims > 8:
                raise self.fail(f"tensor {name!r} claims {n_dims} dimensions")
            dims = tuple(int(self.take("Q")) for _ in range(n_dims))
            table.append((name, dims, self.take("I"), self.take("Q")))
        alignment = int(metadata.get("general.alignment", 32))
        data_start = -(-self.pos // alignment) * alignment
        tensors = []
        for name, dims, type_id, offset in table:
            try:
                block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
            except (ValueError, KeyError):
                raise GGUFError(
                    f"{self.path}: tensor {name!r} has ggml type {type_id}, which is unknown"
                ) from None
            elements = int(np.prod(dims)) if dims else 1
            if dims and dims[0] % block:
                raise GGUFError(
                    f"{self.path}: tensor {name!r} rows of {dims[0]} are not whole blocks of {block}"
                )
            nbytes = elements // block * block_bytes
            start = data_start + offset
            if start + nbytes > len(self.blob):
                raise GGUFError(
                    f"{self.path} is truncated: tensor {name!r} needs bytes {start}..{start + nbytes}, "
                    f"the file ends at {len(self.blob)} (an interrupted download or copy?)"
                )
            tensors.append(TensorInfo(name, dims, type_id, self.path, start, nbytes))
        return GGUFHeader(self.path, metadata, tuple(tensors), metadata_end, len(self.blob))


def split_prefix(name: str) -> str:
    """`model-00001-of-00003.gguf` -> `model`; `model.gguf` -> `model`."""
    match = _SPLIT_NAME.match(name)
    return match["prefix"] if match else name.removesuffix(".gguf")


def split_parts(path: Path) -> tuple[Path, ...]:
    """`path` alone, or every part of the split set it belongs to, in order; GGUFError names the
    parts that are missing."""
    match = _SPLIT_NAME.match(path.name)
    if match is None:
        return (path,)
    count = int(match["count"])
    parts = tuple(
        path.with_name(f"{match['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)
    )
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise GGUFError(
            f"{path} is part of a split set of {count} files, and {len(missing)} are missing from "
            f"{path.parent}: {', '.join(missing)}"
        )
    return parts


def read_model(path: Path, keep_strings: frozenset[str] | set[str] = frozenset()) -> GGUFModel:
    """The model in `path` (a file, or any part of a split set): metadata and every tensor."""
    parts = split_parts(Path(path))
    first = read_header(parts[0], keep_strings)
    headers = [first, *(read_header(p) for p in parts[1:])]
    if len(parts) > 1:
        _check_split(headers)
    tensors: dict[str, TensorInfo] = {}
    for header in headers:
        for info in header.tensors:
            if info.name in tensors:
                raise GGUFError(f"{header.path}: tensor {info.name!r} is also in {tensors[info.name].file}")
            tensors[info.name] = info
    if "general.architecture" not in first.metadata:
        raise GGUFError(f"{first.path} has no general.architecture in its metadata: not a model file")
    return GGUFModel(tuple(parts), first.metadata, tensors)


def _check_split(headers: list[GGUFHeader]) -> None:
    count = len(headers)
    for number, header in enumerate(headers):
        meta = header.metadata
        if meta.get("split.count") != count or meta.get("split.no") != number:
            raise GGUFError(
                f"{header.path} says it is part {meta.get('split.no')} of {meta.get('split.count')}; "
                f"its name makes it part {number} of {count} (index from 0)"
            )
    expected = headers[0].metadata.get("split.tensors.count")
    found = sum(len(h.tensors) for h in headers)
    if expected is not None and expected != found:
        raise GGUFError(
            f"{headers[0].path}: the split set holds {found} tensors; its first part says {expected}"
        )
