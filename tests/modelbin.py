"""A model.bin's tensor table (model/modelfile.h), read for the tests: stdlib only."""
import struct

HEADER_VERSION, HEADER_TENSORS_OFFSET, HEADER_N_TENSORS, ENTRY_SIZE = 8, 168, 176, 88


def read_tensors(path):
    """({name: (dtype, ndim, rows, cols, raw bytes)}, format version) of the model.bin at path."""
    blob = open(path, "rb").read()
    version, = struct.unpack_from("<I", blob, HEADER_VERSION)
    tens_off, = struct.unpack_from("<Q", blob, HEADER_TENSORS_OFFSET)
    n, = struct.unpack_from("<I", blob, HEADER_N_TENSORS)
    out = {}
    for i in range(n):
        e = tens_off + i * ENTRY_SIZE
        name = blob[e:e + 48].split(b"\0")[0].decode()
        dtype, ndim, r, c, off, nbytes = struct.unpack_from("<IIQQQQ", blob, e + 48)
        out[name] = (dtype, ndim, r, c, blob[off:off + nbytes])
    return out, version
