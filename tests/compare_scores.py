#!/usr/bin/env python3
"""compare_scores.py A B TOL [mean]: compare the per-position NLL lines of two `./run --score`
outputs ('i next_id nll [top1]'). By default every position must agree within TOL; with `mean`,
the mean absolute difference must (for long texts, where bf16 rounding can move a rare near-tie
position a lot). Prints max, p99 and mean differences, the difference of the mean NLLs, and, when
both have a top1 column, how often the most likely next ids agree; exits 1 on failure."""
import sys


def read(path):
    rows, mean = [], None
    for line in open(path):
        f = line.split()
        if f and f[0] == "mean_nll":
            mean = float(f[1])
        elif len(f) in (3, 4):
            rows.append((int(f[0]), int(f[1]), float(f[2]), int(f[3]) if len(f) == 4 else None))
    return rows, mean


a, ma = read(sys.argv[1])
b, mb = read(sys.argv[2])
tol = float(sys.argv[3])
by_mean = len(sys.argv) > 4 and sys.argv[4] == "mean"
if len(a) != len(b) or not a or [r[:2] for r in a] != [r[:2] for r in b]:
    print(f"FAIL {sys.argv[1]} vs {sys.argv[2]}: positions differ ({len(a)} vs {len(b)})")
    sys.exit(1)
d = sorted(abs(x[2] - y[2]) for x, y in zip(a, b))
worst, p99, mean_abs = d[-1], d[int(0.99 * (len(d) - 1))], sum(d) / len(d)
ok = (mean_abs if by_mean else worst) <= tol and ma is not None and mb is not None
top1 = ""
if all(r[3] is not None for r in a + b):
    agree = sum(x[3] == y[3] for x, y in zip(a, b)) / len(a)
    top1 = f", top-1 agreement {100 * agree:.2f}%"
print(f"{'ok  ' if ok else 'FAIL'} {sys.argv[1]} vs {sys.argv[2]}: {len(a)} positions, |dNLL| max {worst:.2e} "
      f"p99 {p99:.2e} mean {mean_abs:.2e} (tol {tol:g} on the {'mean' if by_mean else 'max'}), mean_nll {ma} vs {mb}"
      f"{'' if ma is None or mb is None else f' (difference {abs(ma - mb):.4f})'}{top1}")
sys.exit(0 if ok else 1)
