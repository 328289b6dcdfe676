// The CPU path's threads: a pool whose idle threads sleep.
//
// One parallel operation at a time (a matrix product, an attention): its tasks are taken one by
// one, through an atomic counter, by the calling thread and the workers of the team, so a thread
// that the scheduler puts aside (another process wants its core) holds up only the task it has
// taken, not a share fixed in advance. Between operations a worker watches for the next one for
// POOL_SPIN_US microseconds (in a forward pass the next comes sooner than that), then sleeps on a
// futex; the caller waits for the last tasks the same way. A run that waits (for chat input, for
// the GPU) leaves the CPUs to others within microseconds, which OpenMP's default policy (spin for
// ~300K iterations per wait) does not.
//
// Tasks must not call pool_run themselves. OpenBLAS, called inside tasks, runs single-threaded.
#ifndef POOL_H
#define POOL_H

#include "../attention/parallel.h"

#define POOL_SPIN_US 50
#define POOL_MAX_THREADS 256 // a team's most threads

typedef void (*PoolTask)(void *ctx, int task, int thread);

// Runs fn(ctx, i, thread) for i in [0, n_tasks) on the current team (thread in [0, pool_threads())),
// returning when all are done. Workers start at the first call that needs them.
void pool_run(int n_tasks, PoolTask fn, void *ctx);
// The team size for the operations that follow: 1 .. pool_max_threads() (clamped).
void pool_set_threads(int n);
int pool_threads(void);
// The most threads a team may have: set once, before the first pool_run (default: the CPUs of
// this process's affinity mask). Per-thread scratch is sized by it.
void pool_set_max_threads(int n);
int pool_max_threads(void);
// The CPUs in this process's affinity mask: the most threads a run may use when none is given.
int pool_cpus_available(void);

// The pool as attention's parallel for (attention/parallel.h): pool_run and pool_max_threads.
extern const AttnParallel pool_parallel;

#endif
