// The thread-count tuner (threads.h): run with the best count known, probe the others now and
// then, keep the faster.
#include "threads.h"

#include "pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum {
    FIRST_ROUND = 8,  // timed passes with the guessed count before the first probe (a short
                      // prefill of a few chunks then runs without probes: the guess is good)
    PERIOD_MIN = 16,  // passes with the best count between probe rounds, while probes win
    PERIOD_MAX = 512, // ... doubling up to this while they lose clearly
    PROBE = 2,        // passes per probed count (one, when the first is clearly worse)
};
#define CLEARLY_WORSE 1.25

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int threads_guess(int max_threads) {
    int least = -1;
    for (int i = 0; i < 5; i++) {
        FILE *f = fopen("/proc/stat", "r");
        char line[256];
        int running = -1;
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "procs_running %d", &running) == 1) break;
        if (f) fclose(f);
        if (running > 0 && (least < 0 || running < least)) least = running;
        struct timespec ts = {0, 1000000};
        if (i < 4) nanosleep(&ts, NULL);
    }
    if (least < 0) return max_threads; // no /proc: assume idle
    int guess = max_threads - (least - 1);
    return guess < 1 ? 1 : guess;
}

void tuner_init(ThreadTuner *t, int max_threads, int fixed, int guess) {
    *t = (ThreadTuner){0};
    int n = fixed > 0 ? fixed : max_threads > 0 ? max_threads : 1;
    t->cand[t->n_cand++] = n;
    if (fixed <= 0) {
        if (n - 1 > 1) t->cand[t->n_cand++] = n - 1;
        if (n > 1) t->cand[t->n_cand++] = 1;
    }
    for (int j = 0; guess > 0 && j < t->n_cand; j++) // the candidate nearest the guess
        if (abs(t->cand[j] - guess) < abs(t->cand[t->best] - guess)) t->best = j;
    t->probing = -1;
    t->since_probe = -1; // the first pass warms caches and page tables: not timed
    t->period = FIRST_ROUND;
}

int tuner_threads(const ThreadTuner *t) { return t->cand[t->best]; }

void tuner_begin(ThreadTuner *t) {
    t->running = t->probing >= 0 ? t->probing : t->best;
    pool_set_threads(t->cand[t->running]);
    t->t0 = now();
}

// The next candidate to probe in this round, after index i (-1: the round is over).
static int next_other(const ThreadTuner *t, int i) {
    for (int j = i + 1; j < t->n_cand; j++)
        if (j != t->best) return j;
    return -1;
}

static void start_probe(ThreadTuner *t, int i) { t->probing = i, t->probe_left = PROBE, t->probe_sum = 0; }

void tuner_end(ThreadTuner *t, int tokens) { tuner_record(t, (now() - t->t0) / (tokens > 0 ? tokens : 1)); }

void tuner_record(ThreadTuner *t, double dt) {
    if (t->n_cand == 1) return;
    if (t->probing >= 0) {
        // A probe's cost is the mean of its passes (comparable with the best's running mean);
        // one pass is enough when it is clearly worse: probes must not cost much.
        t->probe_sum += dt;
        int done = PROBE - t->probe_left + 1;
        if (--t->probe_left > 0 && !(dt > CLEARLY_WORSE * t->cost[t->best])) return;
        t->cost[t->probing] = t->probe_sum / done;
        int nx = next_other(t, t->probing);
        if (nx >= 0) return start_probe(t, nx);
        t->probing = -1, t->since_probe = 0;
        int old = t->best, clear_loss = 1;
        for (int j = 0; j < t->n_cand; j++) {
            if (j != old && !(t->cost[j] > CLEARLY_WORSE * t->cost[old])) clear_loss = 0;
            if (t->cost[j] > 0 && t->cost[j] < t->cost[t->best]) t->best = j;
        }
        // Probes that keep losing clearly come less often; a change of winner, sooner.
        t->period = t->best != old ? PERIOD_MIN : clear_loss ? (t->period * 2 < PERIOD_MAX ? t->period * 2 : PERIOD_MAX) : PERIOD_MIN;
        if (t->period < PERIOD_MIN) t->period = PERIOD_MIN;
        return;
    }
    if (t->since_probe++ < 0) return; // the warm-up pass
    // Conditions change (another process starts or ends): two passes in a row clearly slower than
    // the best's running cost bring the next probe round forward.
    t->slow = t->cost[t->best] > 0 && dt > CLEARLY_WORSE * t->cost[t->best] ? t->slow + 1 : 0;
    if (t->slow >= 2) t->since_probe = t->period, t->slow = 0;
    t->cost[t->best] = t->cost[t->best] > 0 ? 0.75 * t->cost[t->best] + 0.25 * dt : dt;
    if (t->since_probe >= t->period) start_probe(t, next_other(t, -1));
}
