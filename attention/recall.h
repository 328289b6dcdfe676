// Recall@k of a selection, for measuring ParisKV through ./run on either path (the PKV_RECALL
// measurement: tests/bench/pkv_drift.py): the fraction of the exact top-k keys of the zone, by
// the group's mean query, that the selection holds -- tests/quality's definition.
#ifndef RECALL_H
#define RECALL_H

#include <stdio.h>

// qbar (D): the mean of the KV group's query heads; keys: the zone's nz keys as the attention
// reads them, key i at keys + i * stride; sel: nsel zone slots (0 .. nz-1). Scores in double,
// top-k ties to the smaller slot. 1 when the zone is empty. scratch: recall_scratch_floats() floats.
double recall_at_k(const float *qbar, const float *keys, long stride, int nz, int D, int k, const int *sel, int nsel, float *scratch);
// The same from the scores already computed (score: the first nz floats of scratch may be it).
double recall_from_scores(const float *score, int nz, int k, const int *sel, int nsel, float *scratch);
// scratch floats recall_at_k and recall_from_scores need.
long recall_scratch_floats(int nz, int k);

// The --profile measurement (AttnConfig.profile): how much of one decode step's selection the
// previous step also selected, |a & b| / max(na, nb) (both full: / k), 1 when both are empty.
// a, b: distinct slots (or positions), ascending, as the selectors write them.
double selection_overlap(const int *a, int na, const int *b, int nb);

// The measurement's output, or NULL when PKV_RECALL is not set: one line "pos layer kv_head
// recall" per ParisKV decode step, layer and KV head (opened once per process, appended to).
FILE *recall_file(void);

#endif
