#!/usr/bin/env python3
"""compare_scores.py A B TOL: the per-position NLL lines of two `./run --score` outputs.
Prints the largest difference and the greedy (argmin NLL is not available, so) mean_nll of
each; exits 1 if any position differs by more than TOL."""
import sys


def read(path):
    rows, mean = [], None
    for line in open(path):
        f = line.split()
        if f and f[0] == "mean_nll":
            mean = float(f[1])
        elif len(f) == 3:
            rows.append((int(f[0]), int(f[1]), float(f[2])))
    return rows, mean


a, ma = read(sys.argv[1])
b, mb = read(sys.argv[2])
tol = float(sys.argv[3])
if len(a) != len(b) or not a or [r[:2] for r in a] != [r[:2] for r in b]:
    print(f"FAIL {sys.argv[1]} vs {sys.argv[2]}: positions differ ({len(a)} vs {len(b)})")
    sys.exit(1)
worst = max(abs(x[2] - y[2]) for x, y in zip(a, b))
ok = worst <= tol and ma is not None and mb is not None
print(f"{'ok  ' if ok else 'FAIL'} {sys.argv[1]} vs {sys.argv[2]}: {len(a)} positions, max |dNLL| {worst:.2e} "
      f"(tol {tol:g}), mean_nll {ma} vs {mb}")
sys.exit(0 if ok else 1)
