#!/usr/bin/env python3
# The decode step's layer as a timeline, from kernel_timeline.c's CSV: each layer starts at a
# marker kernel (default ParisKV's pkv_bonus_kernel); for every kernel that runs between two
# markers, the median start and end relative to the marker over all layers of all steps.
# Usage: kernel_timeline.py FILE.csv[.gz] [MARKER]
import collections, csv, gzip, re, statistics as st, sys

path = sys.argv[1]
marker = sys.argv[2] if len(sys.argv) > 2 else "pkv_bonus_kernel"
rows = []
with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
    for r in csv.reader(f):
        if len(r) >= 7:
            rows.append((int(r[0]), int(r[1]), r[4], ",".join(r[6:])))
rows.sort()


def short(name):  # the mangled name without its _Z<length> prefix, cut to 44 characters (the
    return re.sub(r"^_Z\d+", "", name)[:44]  # identifier and the start of its template arguments)


idx = [i for i, r in enumerate(rows) if marker in r[3]]
if len(idx) < 3:
    sys.exit(f"kernel_timeline: {len(idx)} {marker} launches in {len(rows)} kernels: nothing to lay out")
periods = [rows[idx[j + 1]][0] - rows[idx[j]][0] for j in range(len(idx) - 1)]
med = st.median(periods)
ps = sorted(periods)
print(f"kernels {len(rows)}, layers {len(idx)}; layer period median {med / 1e3:.2f} us "
      f"(p10 {ps[len(ps) // 10] / 1e3:.2f}, p90 {ps[9 * len(ps) // 10] / 1e3:.2f})")
acc = collections.defaultdict(lambda: ([], []))
used = 0
for j in range(len(idx) - 1):
    if periods[j] > 1.5 * med:  # a step's end (logits, sampling) falls in this period
        continue
    used += 1
    t0, t1 = rows[idx[j]][0], rows[idx[j + 1]][0]
    seen = collections.Counter()
    for r in rows[max(idx[j] - 64, 0):idx[j + 1] + 1]:  # from 64 launches back: GEMVs started early by PDL
        if r[1] < t0 or r[0] >= t1:  # not running inside this layer's period
            continue
        name = short(r[3])
        seen[name] += 1
        acc[(name, seen[name], r[2])][0].append(r[0] - t0)
        acc[(name, seen[name], r[2])][1].append(r[1] - t0)
print(f"layers laid out: {used} (periods over 1.5x the median left out)")
print(f"{'kernel':44s} {'#':>2s} {'grid':>10s} {'start us':>9s} {'end us':>9s} {'dur us':>8s}")
for key, (s, e) in sorted(acc.items(), key=lambda kv: st.median(kv[1][0])):
    if len(s) < used // 2:
        continue
    d = [b - a for a, b in zip(s, e)]
    print(f"{key[0]:44s} {key[1]:2d} {key[2]:>10s} {st.median(s) / 1e3:9.2f} {st.median(e) / 1e3:9.2f} {st.median(d) / 1e3:8.2f}")
