// How attention spreads its work over threads: a parallel for that the caller supplies.
//
// attention/ sits below model/ (the forward pass calls it), so it does not reach up into the
// model's thread pool: whoever creates a policy or calls attention_dense hands in one of these
// (the CPU pass: model/pool.h's pool_parallel). The blocks of positions are fixed by position
// alone, so how the tasks are spread never changes a result.
#ifndef ATTN_PARALLEL_H
#define ATTN_PARALLEL_H

typedef void (*AttnTask)(void *ctx, int task, int thread);

typedef struct AttnParallel {
    // Runs fn(ctx, i, thread) for every i in [0, n_tasks), thread in [0, max_threads()), and
    // returns when all are done. Tasks must not call run themselves.
    void (*run)(int n_tasks, AttnTask fn, void *ctx);
    // The most threads run may use: per-thread scratch is sized by it.
    int (*max_threads)(void);
} AttnParallel;

#endif
