"""Random token ids for the GPU checks and benchmarks: python3 tests/random_ids.py SEED VOCAB COUNT
prints COUNT ids drawn uniformly below VOCAB with Python's random.seed(SEED), space-separated on one
line (the same ids the scripts' inline one-liners drew before, for the same arguments)."""
import random
import sys

if len(sys.argv) != 4:
    sys.exit("usage: random_ids.py SEED VOCAB COUNT")
seed, vocab, count = (int(a) for a in sys.argv[1:])
random.seed(seed)
print(" ".join(str(random.randrange(vocab)) for _ in range(count)))
