// How many threads the CPU forward pass uses, chosen by measuring.
//
// On an idle machine every core helps; beside another busy process a thread that shares its core
// holds up every fork-join operation it takes part in (each op waits for its slowest thread), and
// two threads become slower than one. No static rule knows which case holds, and it changes while
// a run goes on, so the tuner times the forward passes: it runs with the best thread count it
// knows and now and then probes the others for a couple of passes, keeping whichever is faster
// per token. Decode steps (T = 1) and prefill chunks are tuned apart (their per-token costs
// differ by the batching). `--threads N` fixes the count instead.
// The tuner sits above the pool (model/pool.h): it sets the pool's team size for each pass; the
// pool knows nothing of it.
#ifndef THREADS_H
#define THREADS_H

#define TUNER_MAX_CANDIDATES 3

typedef struct {
    int n_cand;                          // thread counts tried: the most, one fewer, one
    int cand[TUNER_MAX_CANDIDATES];
    double cost[TUNER_MAX_CANDIDATES];   // seconds per token, recent (0: not measured yet)
    int best;                            // index into cand
    int probing, probe_left;             // index being probed (-1: none), passes left in the probe
    double probe_sum;
    int since_probe;                     // passes run with the best since the last probe round
    int period;                          // passes between probe rounds (grows while probes lose)
    int slow;                            // consecutive passes clearly slower than the best's cost
    int running;                         // index in use for the current pass
    double t0;
} ThreadTuner;

// A first guess before any timing: max_threads less the other processes running now (the kernel's
// procs_running, least of a few samples over ~5 ms, ourselves not counted), at least 1. Call it
// before any parallel operation: the pool's threads spin for a moment after one and would count.
int threads_guess(int max_threads);

// fixed > 0: always that many (no tuning). Else tune among max_threads, max_threads - 1 and 1,
// starting from the candidate nearest `guess` (0: max_threads).
void tuner_init(ThreadTuner *t, int max_threads, int fixed, int guess);
// Around one forward pass of `tokens` tokens: begin sets the pool's team size for the pass.
void tuner_begin(ThreadTuner *t);
void tuner_end(ThreadTuner *t, int tokens);
// The thread count of the pass begun last.
static inline int tuner_running(const ThreadTuner *t) { return t->cand[t->running]; }
// tuner_end's second half: the pass just begun took dt seconds per token (tests drive it).
void tuner_record(ThreadTuner *t, double dt);
// The count the tuner currently prefers.
int tuner_threads(const ThreadTuner *t);

#endif
