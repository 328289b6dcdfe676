#!/usr/bin/env python3
"""Hand-made mutants of the selectors (attention/), each of which tests/test_selectors.c should
catch: the README's "N of M mutants caught" is this script's last line. By hand, not in CI (about
20 s a mutant on two cores).

    python3 tests/mutants/selector_mutants.py            # every mutant
    python3 tests/mutants/selector_mutants.py 4 7        # mutants 4 and 7

The tracked sources are copied to a temporary directory; each mutant replaces one exact piece of
text in one file there (a piece that no longer occurs exactly once is reported STALE: the source
changed, the mutant must be rewritten), test_selectors is rebuilt against it and run. A mutant is
caught when the test fails (exit status not 0, a crash, or a time-out of 300 s); SURVIVED lines
name the faults the test does not see. Stdlib only; needs cc."""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CFLAGS = ["-std=c11", "-D_GNU_SOURCE", "-O2", "-fopenmp", "-w"]

# (file, the text as it is, the mutant's text, what the fault is)
MUTANTS = [
    ("attention/streaming.c", "(void)scratch, (void)out;\n    return 0;", "(void)scratch;\n    out[0] = 0;\n    return n > 0;",
     "streaming selects the zone's first key"),
    ("attention/oracle.c", "for (int j = 0; j < o->D; j++) d += q[j] * ki[j];", "for (int j = 0; j < o->D - 1; j++) d += q[j] * ki[j];",
     "oracle: the last channel left out of <q, k>"),
    ("attention/oracle.c", "kvstore_window_k(st, sink + i, kv_head)", "kvstore_window_k(st, sink + i + 1, kv_head)",
     "oracle: each key copied from the next position"),
    ("attention/topk.c", "(a.score == b.score && a.id > b.id)", "(a.score == b.score && a.id < b.id)",
     "top-k: ties go to the larger id"),
    ("attention/topk.c", "if (worse(heap[0], c)) {", "if (worse(c, heap[0])) {", "top-k: the heap keeps the worse item"),
    ("attention/topk.c", "for (int i = k / 2 - 1; i >= 0; i--) sift_down", "for (int i = k / 2 - 1; i > 0; i--) sift_down",
     "top-k: the heap's root never sifted at build"),
    ("attention/quest.c", "u += x > y ? x : y;", "u += x < y ? x : y;", "quest: pages scored by a lower bound"),
    ("attention/quest.c", "if (k[j] > b[j]) b[j] = k[j];", "if (k[j] < b[j]) b[j] = k[j];", "quest: page maxima kept as minima"),
    ("attention/quest.c", "(sp->k + PAGE - 1) / PAGE + 1, heap, chosen);", "(sp->k + PAGE - 1) / PAGE, heap, chosen);",
     "quest: one page too few ranked (short when a chosen page is short)"),
    ("attention/quest.c", "if (taken + len > sp->k) len = cut = sp->k - taken;", "if (taken + len > sp->k) len = sp->k - taken;",
     "quest: the last page not cut to the budget"),
    ("attention/fier.c", "if (x[j] - lo[j] >= 0.5f * (hi[j] - lo[j]))", "if (x[j] - lo[j] > 0.5f * (hi[j] - lo[j]))",
     "fier: a key exactly halfway rounds down"),
    ("attention/fier.c", "diff[j] = q[j] * (hi[j] - lo[j]);", "diff[j] = q[j] * hi[j];", "fier: a set bit adds q hi instead of q (hi - lo)"),
    ("attention/fier.c", "for (int g = from / GROUP; g * GROUP < to; g++) {", "for (int g = (from + GROUP - 1) / GROUP; g * GROUP < to; g++) {",
     "fier: a group that gains tokens is not quantized again"),
    ("attention/kmeans.c", "if (j == 0 || d < bd) bd = d, best = j;", "if (j == 0 || d <= bd) bd = d, best = j;",
     "kmeans: distance ties to the larger centroid index"),
    ("attention/kmeans.c", "for (int b = 0; b < km->M; b++) e += lut[b * CENT + c[b]];", "for (int b = 0; b < km->M - 1; b++) e += lut[b * CENT + c[b]];",
     "kmeans: the last subspace left out of the score"),
    ("attention/kmeans.c", "(float)(sum[j * SUB + t] / cnt[j]);", "(float)(sum[j * SUB + t] / (cnt[j] + 1));",
     "kmeans: centroids averaged over one member too many"),
    ("attention/kmeans.c", "*K = N < CENT ? N : CENT;", "*K = N < CENT ? N - 1 : CENT;", "kmeans: one centroid too few on a small zone"),
    ("attention/pariskv_select.c", "if (n < 5000) *beta = 0.5f, *rho = 0.5f;", "if (n < 5000) *beta = 0.4f, *rho = 0.5f;",
     "pariskv: the schedule's beta below 5000 keys"),
    ("attention/pariskv_select.c", "tiers += before < target[t];", "tiers += before <= target[t];", "pariskv: a tier's boundary one key late"),
    ("attention/pariskv_select.c", "sc += (c >> j) & 1 ? qb[j] : -qb[j];", "sc += (c >> j) & 1 ? -qb[j] : qb[j];",
     "pariskv: the sign patterns scored inverted"),
    ("attention/pariskv_select.c", "int quota = C - above, m = 0;", "int quota = C - above - 1, m = 0;",
     "pariskv: one candidate too few from the threshold bucket"),
    ("attention/pariskv_select.c", "if (score[i] > thr) out[m++] = i;", "if (score[i] >= thr) out[m++] = i;",
     "pariskv: the whole threshold bucket taken"),
    ("attention/pariskv_select.c", "if (C < k) C = k;", "if (C < k) C = C;", "pariskv: C may fall below k"),
    ("attention/pariskv_select.c", "est += pkv_f16_to_f32(w[b]) * d;", "est += d;", "pariskv: the rerank ignores the key's weight"),
    ("attention/pariskv_select.c", "(a.score == b.score && a.id < b.id); } // ties", "(a.score == b.score && a.id > b.id); } // ties",
     "pariskv: pattern ties ranked to the larger id"),
    ("attention/pariskv_select.c", "return (int)ceil(x - 1e-9);", "return (int)ceil(x);", "pariskv: ceil without the slack for double rounding"),
    ("attention/pariskv_select.c", "return round((double)x * 1e6) / 1e6;", "return (double)x;",
     "pariskv: beta and rho taken as floats (C one too high at whole numbers)"),
    ("attention/pariskv.c", "for (int i = 0; i < p->B * PKV_PATTERNS; i++) ix->count[i] = 0;",
     "for (int i = 1; i < p->B * PKV_PATTERNS; i++) ix->count[i] = 0;", "pariskv: reset leaves pattern 0's count"),
]


def run(cmd, cwd, timeout=600):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def main():
    want = {int(a) for a in sys.argv[1:]}
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    caught = survived = stale = 0
    with tempfile.TemporaryDirectory(prefix="pkv-mutants-") as tmp:
        for f in files:
            if f.startswith(("attention/", "tests/", "model/", "offload/")) and f.endswith((".c", ".h")):
                os.makedirs(os.path.dirname(os.path.join(tmp, f)), exist_ok=True)
                shutil.copyfile(os.path.join(ROOT, f), os.path.join(tmp, f))
        srcs = sorted(f for f in files if f.startswith("attention/") and f.endswith(".c"))
        objs = {}
        for f in srcs:  # the unmutated objects, once
            objs[f] = os.path.join(tmp, f[:-2] + ".o")
            run(["cc", *CFLAGS, "-c", "-o", objs[f], f], tmp).check_returncode()
        test_obj = os.path.join(tmp, "test_selectors.o")
        run(["cc", *CFLAGS, "-c", "-o", test_obj, "tests/test_selectors.c"], tmp).check_returncode()
        for i, (path, old, new, what) in enumerate(MUTANTS, 1):
            if want and i not in want:
                continue
            src = open(os.path.join(tmp, path)).read()
            if src.count(old) != 1:
                stale += 1
                print(f"STALE    {i:2} {path}: the text to mutate occurs {src.count(old)} times ({what})", flush=True)
                continue
            mutated = os.path.join(tmp, "mutant.c")
            open(mutated, "w").write(src.replace(old, new))
            mobj = os.path.join(tmp, "mutant.o")
            # compiled from the copy's directory so its relative includes resolve
            c = run(["cc", *CFLAGS, "-I", os.path.dirname(os.path.join(tmp, path)), "-c", "-o", mobj, mutated], tmp)
            if c.returncode != 0:
                stale += 1
                print(f"STALE    {i:2} {path}: the mutant does not compile ({what}): {c.stderr.strip()[-200:]}", flush=True)
                continue
            exe = os.path.join(tmp, "ts")
            link = [o for f, o in objs.items() if f != path] + [mobj, test_obj]
            run(["cc", "-fopenmp", "-o", exe, *link, "-lm"], tmp).check_returncode()
            try:
                p = run([exe], tmp, timeout=300)
                failed_tests = [l for l in p.stdout.splitlines() if l.startswith("FAIL")]
                hit = p.returncode != 0
                why = f"exit {p.returncode}" + (f", {len(failed_tests)} checks failed, first: {failed_tests[0][:100]}" if failed_tests else "")
            except subprocess.TimeoutExpired:
                hit, why = True, "time-out"
            caught += hit
            survived += not hit
            print(f"{'caught  ' if hit else 'SURVIVED'} {i:2} {path}: {what} ({why})", flush=True)
    total = caught + survived
    print(f"{caught} of {total} mutants caught" + (f", {stale} stale" if stale else ""))
    return 0 if stale == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
