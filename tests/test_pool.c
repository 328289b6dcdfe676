// The CPU thread pool (model/pool.c): every task of every operation runs exactly once and the
// operation returns only after all have run, across many short operations of varying sizes and
// team sizes, with more threads than this machine may have cores (so threads are descheduled in
// the middle of operations, the case a fork-join pool gets wrong).
#include "../model/pool.h"
#include "test_pariskv_util.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_TASKS 64

typedef struct {
    _Atomic int hits[MAX_TASKS];
    _Atomic int late; // a task that ran after its operation returned
    _Atomic int open; // 1 while pool_run of this operation is in progress
} Op;

static void task(void *ctx, int i, int thread) {
    Op *op = ctx;
    if (!atomic_load(&op->open)) atomic_fetch_add(&op->late, 1);
    atomic_fetch_add(&op->hits[i], 1);
    for (volatile int k = 0; k < (i * 13 + thread) % 9 * 40; k++) { // uneven work
    }
}

static void on_alarm(int sig) { // a lost or extra completion leaves an operation waiting forever
    (void)sig;
    const char msg[] = "FAIL the pool hung: an operation never completed (120 s)\n0 passed, 1 failed\n";
    if (write(1, msg, sizeof msg - 1) < 0) _exit(2);
    _exit(1);
}

int main(int argc, char **argv) {
    long ops = argc > 1 ? atol(argv[1]) : 400000;
    signal(SIGALRM, on_alarm);
    alarm(120);
    pool_set_max_threads(3);
    Op op;
    atomic_store(&op.late, 0);
    long wrong = 0, first_wrong = -1;
    for (long it = 0; it < ops; it++) {
        int n = 1 + (int)(it * 7919 % MAX_TASKS), team = it % 101 == 0 ? 1 : it % 7 == 0 ? 2 : 3;
        pool_set_threads(team);
        for (int i = 0; i < n; i++) atomic_store(&op.hits[i], 0);
        atomic_store(&op.open, 1);
        pool_run(n, task, &op);
        atomic_store(&op.open, 0);
        for (int i = 0; i < n; i++)
            if (atomic_load(&op.hits[i]) != 1) {
                if (first_wrong < 0) first_wrong = it;
                wrong++;
            }
    }
    check(wrong == 0, "%ld operations of 1..%d tasks on teams of 1-3 threads: every task ran exactly once (%ld wrong, first in operation %ld)",
          ops, MAX_TASKS, wrong, first_wrong);
    check(atomic_load(&op.late) == 0, "no task ran after its operation returned (%d did)", atomic_load(&op.late));
    check(pool_threads() == 3 && pool_max_threads() == 3, "team size and maximum as set");
    pool_set_threads(99);
    check(pool_threads() == 3, "a team larger than the maximum is clamped to it");
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
