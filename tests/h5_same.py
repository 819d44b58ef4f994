"""Exits 0 when two HDF5 result files hold the same objects, every dataset equal bit for bit (NaN
where NaN) and every attribute equal, apart from provenance: /meta command_line and utc_time, and
the attributes `shard` and `merged_from` (a merged file says it was merged), and wall times measured
by the run (the KV comparison's decode_ms and full_decode_ms). Else prints the first
difference and exits 1. Used by tests/cli_slurm.sh to check merged == unsharded.
Usage: h5_same.py A.h5 B.h5"""
import sys

import h5py
import numpy as np

IGNORED = {"shard", "merged_from", "full_decode_ms"}
TIMED = {"/retrieval/kv_compare/decode_ms"}  # wall times: differ from run to run
IGNORED_META = {"command_line", "utc_time"}


def objects(f):
    out = {}
    f.visititems(lambda name, obj: out.__setitem__("/" + name, obj))
    out["/"] = f
    return out


def same(x, y):
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    if x.dtype.kind in "fc":
        return x.tobytes() == y.tobytes()
    return bool(np.all(x == y))


def main(a_path, b_path):
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        oa, ob = objects(a), objects(b)
        if set(oa) != set(ob):
            print("objects differ:", sorted(set(oa) ^ set(ob))[:10])
            return 1
        for name in sorted(oa):
            x, y = oa[name], ob[name]
            if isinstance(x, h5py.Dataset) != isinstance(y, h5py.Dataset):
                print(name, "is a dataset in one file only")
                return 1
            if isinstance(x, h5py.Dataset) and name not in TIMED and not same(x[()], y[()]):
                print(name, "differs:", x.dtype, x.shape, "vs", y.dtype, y.shape)
                return 1
            keys = set(x.attrs) | set(y.attrs)
            for k in sorted(keys):
                if k in IGNORED or (name == "/meta" and k in IGNORED_META):
                    continue
                if k not in x.attrs or k not in y.attrs:
                    print(f"{name} attribute {k} is in one file only")
                    return 1
                if not same(x.attrs[k], y.attrs[k]):
                    print(f"{name} attribute {k} differs: {x.attrs[k]!r} vs {y.attrs[k]!r}")
                    return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
