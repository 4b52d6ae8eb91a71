"""An independent reader for kiln package files (`.kiln`), format version 1.0.

This module was written from docs/format.md alone, without looking at kiln's
C++ sources, to show that the specification is complete enough to read the
format. The test suite (test_independent_reader.py) checks that it agrees with
kiln's own reader (`kiln dump --json --all`).

Usage as a library:

    package = read_package(["model.kiln", "weights.kiln"])
    for blob in package.blobs:
        print(blob.type, blob.name, blob.info)
    weights = package.blobs[2].payload()

Usage from the command line (a short listing, for humans):

    python tests/cli/independent_reader.py [--no-verify] FILE...

Only the standard library plus `xxhash` and `zstandard` are used.

Choices where docs/format.md leaves room (see also the comments below):

* Which byte offset an error names is not specified; this reader names the
  absolute offset of the field (or byte) found to be wrong: the blob start for
  a missing header or a bad magic, the header field for a bad header field,
  the NUL byte of a name, the header_checksum field for a header checksum
  mismatch, the first payload byte for a payload checksum mismatch, the
  later blob for a duplicate name, and the encoded field inside the info
  section for a bad info field or a failed cross-file check.
* Which problem is reported when a blob has several is not specified either.
  Checks run in the order of the list "What a reader must refuse": header
  fields, name, checksums, then the info section field by field (each
  Metadata rule as soon as the fields it needs are decoded), and the
  cross-file checks once all files are read.
* Invalid UTF-8 is not among the refusals, so it is accepted (decoded with
  surrogateescape); reserved header bytes are ignored.
* Blobs of unknown type are skipped after the generic header checks
  (including the header checksum), whatever their flags; their payload is
  not read, so its checksum is only verified if payload() is called.
* An anchor's effective TensorInfo must fit in 63 bits, like any size.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
import sys
import warnings
from typing import Any

import xxhash
import zstandard

# --------------------------------------------------------------------------
# Constants from docs/format.md
# --------------------------------------------------------------------------

#: The format version this reader implements.
READER_MAJOR = 1
READER_MINOR = 0

MAGIC = b"KILNBLOB"
MIN_HEADER_SIZE = 128
ALIGNMENT = 64
MAX_NAME_SIZE = 4096
MAX_RANK = 32
DYNAMIC_DIM = -1            # a dimension known only at run time (anchors only)
NO_BATCH_DIM = 0xFFFFFFFF   # Anchor.batch_dim meaning "no batch dimension"
MAX_SIZE = (1 << 63) - 1    # sizes in bytes must fit in 63 bits
FLAG_COMPRESSED = 1         # flags bit 0: the payload is one zstd frame

# Blob type codes.
EXECUTABLE = 1
METADATA = 2
TENSOR_DATA = 3
FEED_DATA = 4
OPAQUE = 5

TYPE_NAMES = {
    EXECUTABLE: "Executable",
    METADATA: "Metadata",
    TENSOR_DATA: "TensorData",
    FEED_DATA: "FeedData",
    OPAQUE: "Opaque",
}

#: Name namespaces: names are unique per type, except that TensorData and
#: FeedData share one namespace (an anchor binds to either by name).
NAMESPACES = {
    EXECUTABLE: "Executable",
    METADATA: "Metadata",
    TENSOR_DATA: "TensorData/FeedData",
    FEED_DATA: "TensorData/FeedData",
    OPAQUE: "Opaque",
}

#: Data type codes (ONNX TensorProto.DataType numbers): code -> (name, bytes).
DTYPES = {
    1: ("f32", 4),
    2: ("u8", 1),
    3: ("i8", 1),
    4: ("u16", 2),
    5: ("i16", 2),
    6: ("i32", 4),
    7: ("i64", 8),
    9: ("bool", 1),
    10: ("f16", 2),
    11: ("f64", 8),
    12: ("u32", 4),
    13: ("u64", 8),
    16: ("bf16", 2),
    17: ("f8e4m3", 1),
    19: ("f8e5m2", 1),
}

# The fixed 128-byte part of a blob header, field by field (little-endian):
# magic, version_major, version_minor, header_size, blob_type, flags,
# total_size, payload_offset, stored_size, raw_size, payload_checksum,
# header_checksum, name_size, info_size, producer, reserved.
HEADER = struct.Struct("<8sHHIIIQQQQQQII32s16s")
assert HEADER.size == MIN_HEADER_SIZE

# Offsets of the header fields, relative to the blob start, used to name the
# byte of a bad field in error messages.
OFF_VERSION = 8
OFF_HEADER_SIZE = 12
OFF_FLAGS = 20
OFF_TOTAL_SIZE = 24
OFF_PAYLOAD_OFFSET = 32
OFF_STORED_SIZE = 40
OFF_RAW_SIZE = 48
OFF_HEADER_CHECKSUM = 64
OFF_NAME_SIZE = 72
OFF_INFO_SIZE = 76


def align64(x: int) -> int:
    """`x` rounded up to a multiple of 64."""
    return (x + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def xxh3(data: bytes) -> int:
    """XXH3-64 with seed 0, the checksum used by the format."""
    return xxhash.xxh3_64_intdigest(data, seed=0)


# --------------------------------------------------------------------------
# Public types
# --------------------------------------------------------------------------


class FormatError(Exception):
    """A file breaks the format: names the file, the byte offset and the problem."""

    def __init__(self, source: str, offset: int, problem: str):
        super().__init__(f"{source}: byte {offset}: {problem}")
        self.source = source
        self.offset = offset
        self.problem = problem


@dataclasses.dataclass
class Blob:
    """One blob, as decoded from its header, name and info section.

    `info` is decoded per type (see the module's `_decode_*_info` functions);
    it is {} for an Executable and for a blob of unknown type.
    """

    type: int
    name: str
    source: str
    offset: int             # absolute offset of the blob in `source`
    version: str            # "major.minor" from this blob's header
    producer: str
    flags: int
    total_size: int
    payload_offset: int     # relative to `offset`
    stored_size: int
    raw_size: int
    payload_checksum: int
    info: dict

    # Not part of the decoded fields: the mapped file, whether the payload
    # checksum was verified yet, and the absolute offsets of some info fields
    # (for the error messages of the cross-file checks).
    _data: Any = dataclasses.field(default=None, repr=False, compare=False)
    _verified: bool = dataclasses.field(default=False, repr=False, compare=False)
    _offsets: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.type, f"unknown type {self.type}")

    @property
    def compressed(self) -> bool:
        return bool(self.flags & FLAG_COMPRESSED)

    def payload(self) -> bytes:
        """The payload bytes, decompressed when the blob is compressed.

        The payload checksum is verified on first access when the package was
        read with verify_payloads=False (like kiln's default lazy policy).
        """
        start = self.offset + self.payload_offset
        stored = bytes(self._data[start:start + self.stored_size])
        if not self._verified:
            _verify_payload_checksum(self, stored)
        if not self.compressed:
            return stored
        return _decompress_frame(self, stored)


@dataclasses.dataclass
class Package:
    """The files read together, and all their blobs in file order."""

    sources: list[str]
    blobs: list[Blob]


def effective_dims(anchor: dict, replication_factor: int) -> list[int]:
    """The effective shape of an anchor: the shape of its data in memory.

    Start from tensor_info.dims; with remote buffers and repeats > 1 put
    `repeats` in front; then, for per-replica data and replication_factor > 1,
    put `replication_factor` in front.
    """
    dims = list(anchor["tensor_info"]["dims"])
    if anchor["use_remote_buffers"] and anchor["repeats"] > 1:
        dims.insert(0, anchor["repeats"])
    if anchor["is_per_replica"] and replication_factor > 1:
        dims.insert(0, replication_factor)
    return dims


def tensor_size(tensor_info: dict) -> int | None:
    """Size in bytes of a TensorInfo, or None when a dimension is dynamic."""
    if DYNAMIC_DIM in tensor_info["dims"]:
        return None
    size = DTYPES[tensor_info["dtype"]][1]
    for dim in tensor_info["dims"]:
        size *= dim
    return size


def read_package(paths: list[str], verify_payloads: bool = True) -> Package:
    """Reads `paths` as one package, refusing anything docs/format.md forbids.

    Raises FormatError on the first problem found. Blobs of unknown type are
    kept in the listing (with info {}) and reported with a warning.
    """
    blobs: list[Blob] = []
    for path in paths:
        blobs.extend(_read_file(str(path), verify_payloads))
    _check_package(blobs)
    return Package(sources=[str(p) for p in paths], blobs=blobs)


# --------------------------------------------------------------------------
# Walking a file: blob headers
# --------------------------------------------------------------------------


def _read_file(source: str, verify_payloads: bool) -> list[Blob]:
    """Lists the blobs of one file: header at 0, then at 0 + total_size, ..."""
    with open(source, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise FormatError(source, 0, "empty file: not a kiln package")
        # A read-only mapping: payloads are only read when verified or used.
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    blobs = []
    offset = 0
    while offset < size:
        blob = _read_blob(source, data, offset, verify_payloads)
        blobs.append(blob)
        offset += blob.total_size   # > 0: checked in _read_blob
    return blobs


def _read_blob(source: str, data, start: int, verify_payloads: bool) -> Blob:
    """Decodes and checks the blob at `start` (its header, name and info)."""

    def fail(relative: int, problem: str) -> FormatError:
        return FormatError(source, start + relative, problem)

    remaining = len(data) - start
    if remaining < MIN_HEADER_SIZE:
        raise fail(0, f"truncated blob header: a header needs {MIN_HEADER_SIZE} "
                      f"bytes, only {remaining} remain in the file")
    (magic, major, minor, header_size, blob_type, flags, total_size,
     payload_offset, stored_size, raw_size, payload_checksum, header_checksum,
     name_size, info_size, producer, _reserved) = HEADER.unpack_from(data, start)

    # -- The fixed header fields, in the order of "What a reader must refuse".
    if magic != MAGIC:
        raise fail(0, f"bad magic: expected {MAGIC!r}, found {magic!r}")
    if major == 0 or major > READER_MAJOR:
        raise fail(OFF_VERSION, f"unsupported format version {major}.{minor}: "
                                f"this reader reads version {READER_MAJOR}.{READER_MINOR}")
    if header_size < MIN_HEADER_SIZE or header_size % 8 != 0:
        raise fail(OFF_HEADER_SIZE, f"bad header_size {header_size}: must be a "
                                    f"multiple of 8, at least {MIN_HEADER_SIZE}")
    if total_size == 0:
        # A writer writes each header with total_size 0 and completes it last:
        # 0 is what a writer stopped mid-blob leaves behind.
        raise fail(OFF_TOTAL_SIZE, "incomplete blob: total_size is 0 (a writer was "
                                   "stopped before finishing this blob)")
    if total_size % ALIGNMENT != 0:
        raise fail(OFF_TOTAL_SIZE, f"total_size {total_size} is not a multiple of 64")
    if total_size > remaining:
        raise fail(OFF_TOTAL_SIZE, f"blob claims {total_size} bytes but only "
                                   f"{remaining} remain in the file (truncated file?)")
    if total_size != align64(payload_offset + stored_size):
        raise fail(OFF_TOTAL_SIZE, f"total_size {total_size} differs from "
                                   f"align64(payload_offset + stored_size) = "
                                   f"{align64(payload_offset + stored_size)}")
    if payload_offset % ALIGNMENT != 0:
        raise fail(OFF_PAYLOAD_OFFSET, f"payload_offset {payload_offset} is not a multiple of 64")
    # Name and info lie between the header and the payload. (The payload ends
    # within total_size, since total_size == align64(payload_offset + stored_size).)
    if header_size + name_size > payload_offset:
        raise fail(OFF_NAME_SIZE, f"name ({name_size} bytes after a {header_size}-byte "
                                  f"header) runs past the payload offset {payload_offset}")
    if header_size + name_size + info_size > payload_offset:
        raise fail(OFF_INFO_SIZE, f"info ({info_size} bytes) runs past the payload "
                                  f"offset {payload_offset}")
    if name_size == 0:
        raise fail(OFF_NAME_SIZE, "empty name")
    if name_size > MAX_NAME_SIZE:
        raise fail(OFF_NAME_SIZE, f"name of {name_size} bytes: at most {MAX_NAME_SIZE} allowed")
    if flags & ~FLAG_COMPRESSED:
        raise fail(OFF_FLAGS, f"unknown flag bits 0x{flags & ~FLAG_COMPRESSED:x}")
    compressed = bool(flags & FLAG_COMPRESSED)
    if not compressed and raw_size != stored_size:
        raise fail(OFF_RAW_SIZE, f"uncompressed payload with raw_size {raw_size} "
                                 f"!= stored_size {stored_size}")
    # "Only Executable payloads may be compressed" is read as a rule of the
    # known types: a blob of unknown type is skipped, whatever its flags.
    if compressed and blob_type in TYPE_NAMES and blob_type != EXECUTABLE:
        raise fail(OFF_FLAGS, f"compressed {TYPE_NAMES[blob_type]} "
                              f"blob: only Executable payloads may be compressed")

    name_start = start + header_size
    info_start = name_start + name_size
    info_end = info_start + info_size
    raw_name = bytes(data[name_start:info_start])
    if b"\0" in raw_name:
        raise FormatError(source, name_start + raw_name.index(b"\0"), "name contains a NUL byte")

    # -- The header checksum covers the header (checksum field as zero), the
    #    name and the info: everything decoded eagerly. Verify it before
    #    decoding the info.
    header = bytearray(data[start:start + header_size])
    header[OFF_HEADER_CHECKSUM:OFF_HEADER_CHECKSUM + 8] = bytes(8)
    if xxh3(bytes(header) + data[name_start:info_end]) != header_checksum:
        raise fail(OFF_HEADER_CHECKSUM, "header checksum mismatch: the header, name "
                                        "or info is corrupt")

    name = _text(raw_name)

    blob = Blob(
        type=blob_type,
        name=name,
        source=source,
        offset=start,
        version=f"{major}.{minor}",
        # Producer: UTF-8 text padded with NUL bytes (informative, not checked).
        producer=_text(producer.split(b"\0", 1)[0]),
        flags=flags,
        total_size=total_size,
        payload_offset=payload_offset,
        stored_size=stored_size,
        raw_size=raw_size,
        payload_checksum=payload_checksum,
        info={},
        _data=data,
    )
    # A blob of unknown type is skipped: its header must be well formed (and
    # match its checksum) to find the next blob, but its payload is not read.
    if verify_payloads and blob_type in TYPE_NAMES:
        payload_start = start + payload_offset
        _verify_payload_checksum(blob, data[payload_start:payload_start + stored_size])

    # -- The info section, decoded per type. A blob of a newer minor version
    #    may append fields: they are ignored. Otherwise no bytes may be left.
    reader = _InfoReader(source, data, info_start, info_end,
                         allow_trailing=(major == READER_MAJOR and minor > READER_MINOR))
    if blob_type in _INFO_DECODERS:
        _INFO_DECODERS[blob_type](blob, reader, fail)
        reader.finish()
    else:
        warnings.warn(f"{source}: byte {start}: skipping blob {name!r} of unknown "
                      f"type {blob_type}", stacklevel=2)
    return blob


def _verify_payload_checksum(blob: Blob, stored: bytes) -> None:
    if xxh3(stored) != blob.payload_checksum:
        raise FormatError(blob.source, blob.offset + blob.payload_offset,
                          f"payload checksum mismatch in {blob.type_name} "
                          f"{blob.name!r}: the file is corrupt")
    blob._verified = True


def _decompress_frame(blob: Blob, stored: bytes) -> bytes:
    """Decompresses the payload: exactly one zstd frame of raw_size bytes."""
    where = blob.offset + blob.payload_offset
    try:
        decompressor = zstandard.ZstdDecompressor().decompressobj()
        raw = decompressor.decompress(stored)
    except zstandard.ZstdError as e:
        raise FormatError(blob.source, where, f"bad zstd frame in {blob.name!r}: {e}") from None
    if not decompressor.eof or decompressor.unused_data:
        raise FormatError(blob.source, where,
                          f"payload of {blob.name!r} is not exactly one zstd frame")
    if len(raw) != blob.raw_size:
        raise FormatError(blob.source, where,
                          f"payload of {blob.name!r} decompresses to {len(raw)} bytes, "
                          f"raw_size is {blob.raw_size}")
    return raw


def _text(raw: bytes) -> str:
    """Decodes UTF-8 text. Invalid UTF-8 is not among the refusals of
    docs/format.md, so it is accepted; surrogateescape keeps such bytes
    (they round-trip with .encode("utf-8", "surrogateescape"))."""
    return raw.decode("utf-8", errors="surrogateescape")


# --------------------------------------------------------------------------
# Info sections: primitives
# --------------------------------------------------------------------------


class _InfoReader:
    """A cursor over one info section, decoding the format's primitives.

    Every error names the absolute offset of the field being decoded.
    """

    def __init__(self, source: str, data, start: int, end: int, allow_trailing: bool):
        self.source = source
        self.data = data
        self.pos = start
        self.end = end
        self.allow_trailing = allow_trailing

    def error(self, offset: int, problem: str) -> FormatError:
        return FormatError(self.source, offset, problem)

    def take(self, size: int, what: str) -> bytes:
        if size > self.end - self.pos:
            raise self.error(self.pos, f"{what} ({size} bytes) runs past the info "
                                       f"section ({self.end - self.pos} bytes left)")
        raw = bytes(self.data[self.pos:self.pos + size])
        self.pos += size
        return raw

    def _int(self, fmt: str, what: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]

    def u8(self, what: str) -> int:
        return self._int("B", what)

    def u32(self, what: str) -> int:
        return self._int("I", what)

    def u64(self, what: str) -> int:
        return self._int("Q", what)

    def i64(self, what: str) -> int:
        return self._int("q", what)

    def boolean(self, what: str) -> bool:
        at = self.pos
        value = self.u8(what)
        if value > 1:
            raise self.error(at, f"{what}: bool must be 0 or 1, found {value}")
        return value == 1

    def string(self, what: str) -> str:
        length = self.u32(f"{what} length")
        return _text(self.take(length, what))

    def count(self, what: str, min_item_size: int) -> int:
        """A list's u32 count, refused when the items cannot fit in what remains."""
        at = self.pos
        n = self.u32(f"{what} count")
        if n * min_item_size > self.end - self.pos:
            raise self.error(at, f"{what}: {n} items cannot fit in the "
                                 f"{self.end - self.pos} bytes left of the info section")
        return n

    def tensor_info(self, what: str, static: bool) -> dict:
        """A TensorInfo; `static` refuses dynamic (-1) dimensions."""
        start = self.pos
        dtype = self.u8(f"{what} dtype")
        if dtype not in DTYPES:
            raise self.error(start, f"{what}: unknown dtype code {dtype}")
        rank_at = self.pos
        rank = self.u32(f"{what} rank")
        if rank > MAX_RANK:
            raise self.error(rank_at, f"{what}: rank {rank} is over {MAX_RANK}")
        dims = []
        for i in range(rank):
            at = self.pos
            dim = self.i64(f"{what} dims[{i}]")
            if dim < DYNAMIC_DIM:
                raise self.error(at, f"{what}: dimension {dim} is below -1")
            if dim == DYNAMIC_DIM and static:
                raise self.error(at, f"{what}: a stored tensor cannot have a dynamic dimension")
            dims.append(dim)
        info = {"dtype": dtype, "dims": dims}
        size = tensor_size(info)
        if size is not None and size > MAX_SIZE:
            raise self.error(start, f"{what}: size in bytes overflows 63 bits")
        return info

    def finish(self) -> None:
        """Refuses bytes left over, unless the blob has a newer minor version."""
        if self.pos != self.end and not self.allow_trailing:
            raise self.error(self.pos, f"{self.end - self.pos} bytes left over at the "
                                       f"end of the info section")


# Smallest encodings, used to refuse list counts that cannot fit.
_U32 = 4
_STRING = 4                       # an empty string: its u32 length
_TENSOR_INFO = 1 + 4              # dtype and rank 0
_ANCHOR = _STRING + _STRING + 4 + _TENSOR_INFO + 1 + 1 + 1 + 4 + 4


# --------------------------------------------------------------------------
# Info sections, per blob type
# --------------------------------------------------------------------------


def _decode_executable_info(blob: Blob, r: _InfoReader, fail) -> None:
    # Info is empty: finish() refuses any byte (unless a newer minor version).
    pass


def _decode_metadata_info(blob: Blob, r: _InfoReader, fail) -> None:
    if blob.stored_size != 0:
        raise fail(OFF_STORED_SIZE, f"Metadata payload must be empty, stored_size "
                                    f"is {blob.stored_size}")
    info: dict[str, Any] = {}
    blob._offsets["executable"] = r.pos
    info["executable"] = r.string("executable")

    at = r.pos
    device_kind = r.string("target.device_kind")
    if not device_kind:
        raise r.error(at, "target.device_kind is empty")
    at = r.pos
    num_devices = r.u32("target.num_devices")
    if num_devices < 1:
        raise r.error(at, "target.num_devices must be at least 1")
    features = [r.string("target.features item")
                for _ in range(r.count("target.features", _STRING))]
    info["target"] = {"device_kind": device_kind, "num_devices": num_devices,
                      "features": features}

    at = r.pos
    info["replication_factor"] = r.u32("replication_factor")
    if info["replication_factor"] < 1:
        raise r.error(at, "replication_factor must be at least 1")
    info["is_inference"] = r.boolean("is_inference")

    options = {}
    for _ in range(r.count("options", 2 * _STRING)):
        at = r.pos
        key = r.string("option key")
        value = r.string("option value")
        if key in options:
            raise r.error(at, f"duplicate option key {key!r}")
        options[key] = value
    info["options"] = options

    # Program indices used before the programs map is decoded: (offset, index).
    used: list[tuple[int, int]] = []

    def program_list(what: str) -> list[int]:
        items = []
        for _ in range(r.count(what, _U32)):
            at = r.pos
            index = r.u32(f"{what} item")
            used.append((at, index))
            items.append(index)
        return items

    info["program_flow"] = {step: program_list(f"program_flow.{step}")
                            for step in ("load", "main", "save")}

    programs: dict[int, str] = {}
    for _ in range(r.count("programs", _U32 + _STRING)):
        at = r.pos
        index = r.u32("program index")
        name = r.string("program name")
        if index in programs:
            raise r.error(at, f"duplicate program index {index}")
        programs[index] = name
    info["programs"] = programs
    for at, index in used:
        if index not in programs:
            raise r.error(at, f"program index {index} in the program flow is not "
                              f"in the programs map")

    anchors = []
    names_seen: dict[str, set[str]] = {"input": set(), "output": set()}
    handles_seen: set[str] = set()
    anchor_offsets = []
    for _ in range(r.count("anchors", _ANCHOR)):
        anchor, offsets = _decode_anchor(r, programs)
        # The effective TensorInfo is the data's size in memory: it must fit
        # in 63 bits too.
        effective = {"dtype": anchor["tensor_info"]["dtype"],
                     "dims": effective_dims(anchor, info["replication_factor"])}
        size = tensor_size(effective)
        if size is not None and size > MAX_SIZE:
            raise r.error(offsets["tensor_info"], f"anchor {anchor['name']!r}: effective "
                                                  f"size in bytes overflows 63 bits")
        if anchor["name"] in names_seen[anchor["direction"]]:
            raise r.error(offsets["name"], f"duplicate {anchor['direction']} anchor name "
                                           f"{anchor['name']!r}")
        names_seen[anchor["direction"]].add(anchor["name"])
        if anchor["handle"] in handles_seen:
            raise r.error(offsets["handle"], f"duplicate anchor handle {anchor['handle']!r}")
        handles_seen.add(anchor["handle"])
        anchors.append(anchor)
        anchor_offsets.append(offsets)
    info["anchors"] = anchors
    blob._offsets["anchors"] = anchor_offsets
    blob.info = info


def _decode_anchor(r: _InfoReader, programs: dict[int, str]) -> tuple[dict, dict]:
    """One Anchor; returns it and the absolute offsets of some of its fields."""
    offsets = {"name": r.pos}
    name = r.string("anchor name")
    if not name:
        raise r.error(offsets["name"], "empty anchor name")
    offsets["handle"] = r.pos
    handle = r.string("anchor handle")
    if not handle:
        raise r.error(offsets["handle"], f"anchor {name!r}: empty handle")
    anchor_programs = []
    for _ in range(r.count(f"anchor {name!r} programs", _U32)):
        at = r.pos
        index = r.u32(f"anchor {name!r} program")
        if index not in programs:
            raise r.error(at, f"anchor {name!r}: program index {index} is not in "
                              f"the programs map")
        anchor_programs.append(index)
    offsets["tensor_info"] = r.pos
    tensor_info = r.tensor_info(f"anchor {name!r} tensor_info", static=False)
    at = r.pos
    direction = r.u8(f"anchor {name!r} direction")
    if direction not in (0, 1):
        raise r.error(at, f"anchor {name!r}: direction must be 0 or 1, found {direction}")
    is_per_replica = r.boolean(f"anchor {name!r} is_per_replica")
    use_remote_buffers = r.boolean(f"anchor {name!r} use_remote_buffers")
    at = r.pos
    repeats = r.u32(f"anchor {name!r} repeats")
    if repeats < 1:
        raise r.error(at, f"anchor {name!r}: repeats must be at least 1")
    at = r.pos
    batch_dim = r.u32(f"anchor {name!r} batch_dim")
    if batch_dim == NO_BATCH_DIM:
        batch_dim = None
    elif batch_dim >= len(tensor_info["dims"]):
        raise r.error(at, f"anchor {name!r}: batch_dim {batch_dim} is not a dimension "
                          f"of a rank-{len(tensor_info['dims'])} tensor_info")
    anchor = {
        "name": name,
        "handle": handle,
        "programs": anchor_programs,
        "tensor_info": tensor_info,
        "direction": "input" if direction == 0 else "output",
        "is_per_replica": is_per_replica,
        "use_remote_buffers": use_remote_buffers,
        "repeats": repeats,
        "batch_dim": batch_dim,
    }
    return anchor, offsets


def _decode_tensor_data_info(blob: Blob, r: _InfoReader, fail) -> None:
    tensor_info = r.tensor_info("TensorData tensor_info", static=True)
    if blob.stored_size != tensor_size(tensor_info):
        raise fail(OFF_STORED_SIZE, f"stored_size {blob.stored_size} differs from the "
                                    f"TensorInfo's size {tensor_size(tensor_info)}")
    blob.info = {"tensor_info": tensor_info}


def _decode_feed_data_info(blob: Blob, r: _InfoReader, fail) -> None:
    tensor_info = r.tensor_info("FeedData tensor_info", static=True)
    at = r.pos
    count = r.u64("FeedData count")
    size = count * tensor_size(tensor_info)
    if size > MAX_SIZE:
        raise r.error(at, f"FeedData of {count} items: size in bytes overflows 63 bits")
    if blob.stored_size != size:
        raise fail(OFF_STORED_SIZE, f"stored_size {blob.stored_size} differs from count "
                                    f"x TensorInfo size = {size}")
    blob.info = {"tensor_info": tensor_info, "count": count}


def _decode_opaque_info(blob: Blob, r: _InfoReader, fail) -> None:
    blob._offsets["executable"] = r.pos
    blob.info = {"executable": r.string("Opaque executable")}


_INFO_DECODERS = {
    EXECUTABLE: _decode_executable_info,
    METADATA: _decode_metadata_info,
    TENSOR_DATA: _decode_tensor_data_info,
    FEED_DATA: _decode_feed_data_info,
    OPAQUE: _decode_opaque_info,
}


# --------------------------------------------------------------------------
# Checks across the files read together
# --------------------------------------------------------------------------


def _check_package(blobs: list[Blob]) -> None:
    """Unique names per namespace, executable links, package-provided anchors."""
    by_namespace: dict[str, dict[str, Blob]] = {}
    for blob in blobs:
        namespace = NAMESPACES.get(blob.type)
        if namespace is None:       # unknown type: skipped
            continue
        names = by_namespace.setdefault(namespace, {})
        if blob.name in names:
            first = names[blob.name]
            raise FormatError(blob.source, blob.offset,
                              f"duplicate {namespace} name {blob.name!r} (first at "
                              f"{first.source} byte {first.offset})")
        names[blob.name] = blob

    executables = by_namespace.get(NAMESPACES[EXECUTABLE], {})
    data_blobs = by_namespace.get(NAMESPACES[TENSOR_DATA], {})
    for blob in blobs:
        if blob.type in (METADATA, OPAQUE):
            executable = blob.info["executable"]
            linked = blob.type == METADATA or executable != ""   # Opaque may be unlinked
            if linked and executable not in executables:
                raise FormatError(blob.source, blob._offsets["executable"],
                                  f"{blob.type_name} {blob.name!r} names executable "
                                  f"{executable!r}, which none of the files holds")
        if blob.type == METADATA:
            _check_package_provided_anchors(blob, data_blobs)


def _check_package_provided_anchors(metadata: Blob, data_blobs: dict[str, Blob]) -> None:
    """An anchor named like a TensorData/FeedData blob binds to it: the data's
    TensorInfo (for a FeedData, the TensorInfo of one item) must equal the
    anchor's effective TensorInfo."""
    replication_factor = metadata.info["replication_factor"]
    for anchor, offsets in zip(metadata.info["anchors"], metadata._offsets["anchors"]):
        data = data_blobs.get(anchor["name"])
        if data is None:
            continue    # user-provided
        expected = {"dtype": anchor["tensor_info"]["dtype"],
                    "dims": effective_dims(anchor, replication_factor)}
        if data.info["tensor_info"] != expected:
            raise FormatError(metadata.source, offsets["tensor_info"],
                              f"package-provided anchor {anchor['name']!r} of "
                              f"{metadata.name!r}: effective TensorInfo "
                              f"{_describe(expected)} differs from {data.type_name} "
                              f"{data.name!r} ({data.source} byte {data.offset}): "
                              f"{_describe(data.info['tensor_info'])}")


def _describe(tensor_info: dict) -> str:
    dtype = DTYPES.get(tensor_info["dtype"], (f"dtype {tensor_info['dtype']}",))[0]
    return f"{dtype} {tensor_info['dims']}"


# --------------------------------------------------------------------------
# Command line: a short listing
# --------------------------------------------------------------------------


def _print_listing(package: Package) -> None:
    for source in package.sources:
        print(f"{source}:")
        for blob in (b for b in package.blobs if b.source == source):
            extra = " compressed" if blob.compressed else ""
            print(f"  {blob.offset:>10}  {blob.type_name:<12} {blob.total_size:>10} bytes"
                  f"  {blob.name!r}  v{blob.version}{extra}")
            if blob.type == METADATA:
                info = blob.info
                target = info["target"]
                print(f"      executable {info['executable']!r}, {target['device_kind']} x"
                      f"{target['num_devices']}, replication {info['replication_factor']}")
                for anchor in info["anchors"]:
                    provided = "package" if any(
                        b.name == anchor["name"] and b.type in (TENSOR_DATA, FEED_DATA)
                        for b in package.blobs) else "user"
                    print(f"      {anchor['direction']:<6} {anchor['name']!r}: "
                          f"{_describe(anchor['tensor_info'])}, effective "
                          f"{effective_dims(anchor, info['replication_factor'])} "
                          f"({provided}-provided)")
            elif blob.type in (TENSOR_DATA, FEED_DATA):
                count = f" x {blob.info['count']}" if blob.type == FEED_DATA else ""
                print(f"      {_describe(blob.info['tensor_info'])}{count}")
            elif blob.type == OPAQUE:
                print(f"      executable {blob.info['executable']!r}")


def main(argv: list[str]) -> int:
    verify = "--no-verify" not in argv
    paths = [a for a in argv if a != "--no-verify"]
    if not paths:
        print("usage: independent_reader.py [--no-verify] FILE...", file=sys.stderr)
        return 2
    try:
        package = read_package(paths, verify_payloads=verify)
    except FormatError as e:
        print(f"independent_reader: error: {e}", file=sys.stderr)
        return 1
    _print_listing(package)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
