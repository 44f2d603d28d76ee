"""Minimal writer of Chakra execution traces (``.et``) for single-node ASTRA-Sim workloads.

An ``.et`` file is a stream of protobuf messages, each preceded by its length as a varint: one
``GlobalMetadata`` record, then ``Node`` records. Only what a lone collective or send/recv needs is
encoded here (no protobuf dependency): node ``id`` (field 1), ``name`` (2), ``type`` (3) and
attributes (10); attributes carry ``name`` (1) and one value: ``int32_val`` (7), ``int64_val``
(9), ``bool_val`` (27) or ``bool_list`` (28, a ``BoolList`` whose ``values`` are field 1,
packed), as Chakra's ``schema/protobuf/et_def.proto`` numbers them. A collective over some of
the topology's dimensions carries ASTRA-Sim's ``involved_dim`` attribute (a bool list, one per
dimension; the workload layer's ``issue_comm`` reads it, all dimensions when absent).

Node type numbers follow the LLMServingSim fork of Chakra, which inserts ``PIM_COMP_NODE = 4``
(so ``COMP_NODE = 5``, ``COMM_SEND_NODE = 6``, ``COMM_RECV_NODE = 7``, ``COMM_COLL_NODE = 8``);
pass ``node_types=UPSTREAM_NODE_TYPES`` for an upstream ASTRA-Sim binary.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from astra_bridge.collectives import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER

FORK_NODE_TYPES = {"COMP": 5, "SEND": 6, "RECV": 7, "COLL": 8}
UPSTREAM_NODE_TYPES = {"COMP": 4, "SEND": 5, "RECV": 6, "COLL": 7}
COMM_TYPE_IDS = {ALL_REDUCE: 0, ALL_GATHER: 2, ALL_TO_ALL: 6, REDUCE_SCATTER: 7}
ET_VERSION = "0.0.4"


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # two's complement, as protobuf encodes negative int32/int64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(field_no: int, wire: int) -> bytes:
    return _varint(field_no << 3 | wire)


def _len_field(field_no: int, payload: bytes) -> bytes:
    return _key(field_no, 2) + _varint(len(payload)) + payload


def _int_field(field_no: int, value: int) -> bytes:
    return _key(field_no, 0) + _varint(value)


@dataclass(frozen=True, slots=True)
class Attr:
    """One node attribute: ``kind`` is ``int32``, ``int64`` or ``bool``."""

    name: str
    value: int | bool | tuple[bool, ...]
    kind: str = "int64"

    def encode(self) -> bytes:
        name = _len_field(1, self.name.encode())
        if self.kind == "bool_list":
            assert isinstance(self.value, tuple)
            packed = b"".join(_varint(int(bool(v))) for v in self.value)
            return name + _len_field(28, _len_field(1, packed))
        field_no = {"int32": 7, "int64": 9, "bool": 27}[self.kind]
        assert not isinstance(self.value, tuple)
        return name + _int_field(field_no, int(self.value))


@dataclass(frozen=True, slots=True)
class EtNode:
    """One trace node (no dependencies: each trace here holds a single node)."""

    node_id: int
    name: str
    node_type: int
    attrs: tuple[Attr, ...] = ()

    def encode(self) -> bytes:
        body = _int_field(1, self.node_id) + _len_field(2, self.name.encode())
        body += _int_field(3, self.node_type)
        for a in self.attrs:
            body += _len_field(10, a.encode())
        return body


def encode_trace(nodes: Iterable[EtNode], version: str = ET_VERSION) -> bytes:
    """Bytes of one ``.et`` file: the metadata record followed by the nodes, length-prefixed."""
    records = [_len_field(1, version.encode())] + [n.encode() for n in nodes]
    return b"".join(_varint(len(r)) + r for r in records)


def decode_records(data: bytes) -> list[bytes]:
    """Split an ``.et`` byte stream into its length-prefixed records (for checks and tests)."""
    out, pos = [], 0
    while pos < len(data):
        length, pos = _read_varint(data, pos)
        out.append(data[pos : pos + length])
        pos += length
    return out


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def parse_fields(message: bytes) -> list[tuple[int, int | bytes]]:
    """``(field number, value)`` pairs of one protobuf message (varint and length-delimited only)."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(message):
        key, pos = _read_varint(message, pos)
        field_no, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(message, pos)
            out.append((field_no, value))
        elif wire == 2:
            length, pos = _read_varint(message, pos)
            out.append((field_no, message[pos : pos + length]))
            pos += length
        else:
            raise ValueError(f"wire type {wire} is not used by this writer")
    return out


def collective_node(
    op: str,
    nbytes: int,
    types: Mapping[str, int] = FORK_NODE_TYPES,
    involved_dims: tuple[bool, ...] | None = None,
) -> EtNode:
    """A GPU collective node of ``nbytes`` over the ``involved_dims`` of the topology (all
    dimensions when None or all true: then no ``involved_dim`` attribute is written)."""
    attrs = [
        Attr("is_cpu_op", False, "bool"),
        Attr("comm_type", COMM_TYPE_IDS[op], "int64"),
        Attr("comm_size", nbytes, "int64"),
    ]
    if involved_dims is not None and not all(involved_dims):
        attrs.append(Attr("involved_dim", tuple(bool(f) for f in involved_dims), "bool_list"))
    return EtNode(0, op.upper().replace("-", "_"), types["COLL"], tuple(attrs))


def p2p_node(
    send: bool, nbytes: int, src: int, dst: int, types: Mapping[str, int] = FORK_NODE_TYPES
) -> EtNode:
    """The send half (on ``src``) or receive half (on ``dst``) of a point-to-point transfer."""
    return EtNode(
        0,
        "SEND" if send else "RECV",
        types["SEND" if send else "RECV"],
        (
            Attr("is_cpu_op", False, "bool"),
            Attr("comm_src", src, "int32"),
            Attr("comm_dst", dst, "int32"),
            Attr("comm_tag", 0, "int32"),
            Attr("comm_size", nbytes, "int64"),
        ),
    )


def write_traces(prefix: Path, per_npu: Mapping[int, list[EtNode]], num_npus: int) -> None:
    """Write ``<prefix>.<npu>.et`` for every NPU (NPUs absent from ``per_npu`` get no nodes)."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for npu in range(num_npus):
        path = prefix.parent / f"{prefix.name}.{npu}.et"
        path.write_bytes(encode_trace(per_npu.get(npu, [])))
