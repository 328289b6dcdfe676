// The CPU path's thread pool (pool.h): tasks claimed through one atomic word, waits that spin
// briefly and then sleep on a futex.
#include "pool.h"

#include <limits.h>
#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

// The one pool of the process (a runner has one CPU team). The current operation's fields are
// written by the caller before it publishes the operation in `claim`, and read by a worker after
// it sees the operation there. When an operation is done the caller closes `claim` (index past any
// task) before it writes the next operation's fields: a worker that read `claim` before the close
// and a field after it (the next operation's) fails its claim, since `claim` changed in between,
// and uses nothing. (Without the close such a worker could claim index n of the finished
// operation while holding the next one's larger n, and run that task twice.)
// The words every task touches sit on cache lines of their own: a line that two cores write
// travels between them at each write, and on a machine whose cores share no cache (two vCPUs on
// different dies) each trip costs a memory latency.
static struct {
    int max, team, started, blas_single;
    _Alignas(64) _Atomic uint64_t claim; // (operation id << 32) | next task index
    _Alignas(64) _Atomic uint32_t done;  // tasks of the current operation finished
    _Atomic int caller_asleep;
    _Alignas(64) _Atomic uint32_t seq;   // bumped for each operation: sleeping workers wait on it
    _Atomic int sleepers;                // workers asleep on seq
    _Atomic(PoolTask) fn;
    _Atomic(void *) ctx;
    _Atomic int n, team_now;
    uint32_t op;                         // the caller's operation counter
} P = {.team = 0};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val) { syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0); }
static void futex_wake(_Atomic uint32_t *addr, int n) { syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0); }

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

// Spins until (*addr == val) != equal, or POOL_SPIN_US pass; returns whether that happened.
static int spin(_Atomic uint32_t *addr, uint32_t val, int equal) {
    double t0 = 0.0;
    for (int i = 0;; i++) {
        if ((atomic_load_explicit(addr, memory_order_acquire) == val) != equal) return 1;
        cpu_relax();
        if ((i & 63) == 63) {
            double t = now_us();
            if (t0 == 0.0) t0 = t;
            else if (t - t0 > POOL_SPIN_US) return 0;
        }
    }
}

// Claims and runs tasks of the operation seen in `claim` until none is left, then counts them
// done at once (one write to `done` per thread and operation, not per task).
static void work(int thread) {
    uint64_t c = atomic_load_explicit(&P.claim, memory_order_acquire);
    if (thread >= atomic_load_explicit(&P.team_now, memory_order_acquire)) return;
    uint32_t op = (uint32_t)(c >> 32), n = (uint32_t)atomic_load_explicit(&P.n, memory_order_acquire), ran = 0;
    PoolTask fn = atomic_load_explicit(&P.fn, memory_order_acquire);
    void *ctx = atomic_load_explicit(&P.ctx, memory_order_acquire);
    while ((uint32_t)(c >> 32) == op && (uint32_t)c < n) {
        if (!atomic_compare_exchange_weak_explicit(&P.claim, &c, c + 1, memory_order_acq_rel, memory_order_acquire)) continue;
        fn(ctx, (int)(uint32_t)c, thread);
        ran++;
        c = atomic_load_explicit(&P.claim, memory_order_acquire);
    }
    if (ran && atomic_fetch_add(&P.done, ran) + ran == n && atomic_load(&P.caller_asleep)) futex_wake(&P.done, 1);
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    omp_set_num_threads(1); // OpenBLAS (its OpenMP build) follows this thread's count: one
    uint32_t seen = 0;
    for (;;) {
        if (!spin(&P.seq, seen, 1)) { // no new operation soon: sleep
            atomic_fetch_add(&P.sleepers, 1);
            while (atomic_load(&P.seq) == seen) futex_wait(&P.seq, seen);
            atomic_fetch_sub(&P.sleepers, 1);
        }
        seen = atomic_load_explicit(&P.seq, memory_order_acquire);
        work(id);
    }
    return NULL;
}

int pool_cpus_available(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void pool_set_max_threads(int n) {
    if (P.started) return; // fixed once workers exist
    P.max = n < 1 ? 1 : n > POOL_MAX_THREADS ? POOL_MAX_THREADS : n;
    if (P.team == 0 || P.team > P.max) P.team = P.max;
}

int pool_max_threads(void) {
    if (P.max == 0) pool_set_max_threads(pool_cpus_available());
    return P.max;
}

void pool_set_threads(int n) {
    int max = pool_max_threads();
    P.team = n < 1 ? 1 : n > max ? max : n;
}

int pool_threads(void) {
    if (P.team == 0) pool_set_threads(pool_max_threads());
    return P.team;
}

static void start_workers(void) {
    P.started = 1;
    for (int i = 1; i < P.max; i++) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&th, &attr, worker, (void *)(intptr_t)i) != 0) { // run with the threads there are
            P.max = i;
            if (P.team > P.max) P.team = P.max;
        }
        pthread_attr_destroy(&attr);
        if (P.max == i) break;
    }
}

void pool_run(int n_tasks, PoolTask fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!P.blas_single) { // OpenBLAS (its OpenMP build) takes the calling thread's OpenMP count: one
        omp_set_num_threads(1);
        P.blas_single = 1;
    }
    int team = pool_threads();
    if (team == 1 || n_tasks == 1) {
        for (int i = 0; i < n_tasks; i++) fn(ctx, i, 0);
        return;
    }
    if (!P.started) start_workers();
    if (team > P.max) team = P.max;
    // Release: a worker that reads any of these also sees the previous operation's close.
    atomic_store_explicit(&P.fn, fn, memory_order_release);
    atomic_store_explicit(&P.ctx, ctx, memory_order_release);
    atomic_store_explicit(&P.n, n_tasks, memory_order_release);
    atomic_store_explicit(&P.team_now, team, memory_order_release);
    atomic_store(&P.done, 0);
    atomic_store_explicit(&P.claim, (uint64_t)++P.op << 32, memory_order_release);
    atomic_fetch_add(&P.seq, 1);
    if (atomic_load(&P.sleepers) > 0) futex_wake(&P.seq, INT_MAX);
    work(0);
    uint32_t n = (uint32_t)n_tasks;
    if (!spin(&P.done, n, 0)) {
        // The last tasks are on threads that may have been descheduled: sleep, leaving them the core.
        atomic_store(&P.caller_asleep, 1);
        for (uint32_t d; (d = atomic_load(&P.done)) != n;) futex_wait(&P.done, d);
        atomic_store(&P.caller_asleep, 0);
    }
    atomic_exchange_explicit(&P.claim, ((uint64_t)P.op << 32) | UINT32_MAX, memory_order_acq_rel); // the close
}

const AttnParallel pool_parallel = {pool_run, pool_max_threads};
