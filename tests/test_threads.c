// The thread-count tuner (model/threads.h) on simulated machines: per-token costs by thread count
// stand in for the clock, so the choices are exact and repeatable. It must settle on the faster
// count within a few passes, spend few passes probing, and follow a change of conditions.
#include "../model/threads.h"
#include "test_pariskv_util.h"

#include <stdio.h>

// Runs n passes where a pass with `thr` threads costs cost[thr]; returns the passes at `want`.
static int simulate(ThreadTuner *t, const double *cost, int n, int want, int *first_at_want) {
    int at_want = 0;
    *first_at_want = -1;
    for (int i = 0; i < n; i++) {
        tuner_begin(t);
        int thr = tuner_running(t);
        if (thr == want) {
            at_want++;
            if (*first_at_want < 0) *first_at_want = i;
        }
        tuner_record(t, cost[thr]);
    }
    return at_want;
}

int main(void) {
    ThreadTuner t;
    int first;
    // 2 CPUs, idle: two threads 1.6x faster. A busy neighbour: two threads 1.6x slower than one.
    double idle[3] = {0, 1.0, 0.62}, busy[3] = {0, 1.0, 1.65}, same[3] = {0, 1.0, 1.0};
    tuner_init(&t, 2, 0, 0);
    int n = simulate(&t, idle, 500, 2, &first);
    check(n >= 480 && tuner_threads(&t) == 2, "idle: 2 threads in %d of 500 passes (>= 96%%), preferred at the end", n);
    tuner_init(&t, 2, 0, 0);
    n = simulate(&t, busy, 500, 1, &first);
    check(n >= 485 && tuner_threads(&t) == 1, "beside a busy process, no guess: 1 thread in %d of 500 passes (>= 97%%)", n);
    tuner_init(&t, 2, 0, 1); // the start-up guess saw the busy process
    n = simulate(&t, busy, 500, 1, &first);
    check(n >= 495 && first == 0, "... guessed at start-up: 1 thread from pass %d, in %d of 500", first, n);
    tuner_init(&t, 2, 0, 1); // a wrong guess (the neighbour has gone) is corrected by the first probe
    n = simulate(&t, idle, 500, 2, &first);
    check(first >= 0 && first <= 10 && n >= 480, "a wrong guess: 2 threads from pass %d, in %d of 500", first, n);
    int g = threads_guess(4);
    check(g >= 1 && g <= 4, "threads_guess(4) = %d, within [1, 4]", g);
    // Conditions change mid-run: idle, then a busy neighbour arrives, then leaves.
    tuner_init(&t, 2, 0, 0);
    simulate(&t, idle, 200, 2, &first);
    n = simulate(&t, busy, 200, 1, &first);
    check(first >= 0 && first <= 3 && n >= 185, "a neighbour arrives: 1 thread from pass %d, %d of 200", first, n);
    n = simulate(&t, idle, 600, 2, &first);
    check(first >= 0 && first <= 520 && tuner_threads(&t) == 2, "it leaves: back to 2 threads by pass %d (probes back off to at most 512 passes)", first);
    // No difference: whichever it keeps, it stays put and probes rarely.
    tuner_init(&t, 2, 0, 0);
    int switches = 0, last = -1;
    for (int i = 0; i < 300; i++) {
        tuner_begin(&t);
        if (tuner_threads(&t) != last) switches++, last = tuner_threads(&t);
        tuner_record(&t, same[tuner_running(&t)]);
    }
    check(switches <= 3, "equal costs: the preference changes %d times in 300 passes", switches);
    // 8 CPUs: candidates 8, 7, 1; beside one busy process 7 threads win.
    double eight[9] = {0, 1.0, 0, 0, 0, 0, 0, 0.2, 0.45};
    tuner_init(&t, 8, 0, 0);
    n = simulate(&t, eight, 300, 7, &first);
    check(tuner_threads(&t) == 7 && n >= 280, "8 CPUs, one busy: 7 threads in %d of 300 passes", n);
    // --threads: fixed, never probes.
    double four[4] = {0, 1.0, 0.7, 0.5};
    tuner_init(&t, 2, 3, 0);
    n = simulate(&t, four, 50, 3, &first);
    check(n == 50, "a fixed count is always used (%d of 50)", n);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
