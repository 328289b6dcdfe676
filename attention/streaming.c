// StreamingLLM as a Selector: nothing from the retrieval zone; the step attends to the sink, the
// local window and the update buffer only.
#include "attention.h"
#include "selector.h"

#include <stdlib.h>

static void st_extend(Selector *s, int layer, int kv_head, const KVStore *st, int sink, int from, int to) {
    (void)s, (void)layer, (void)kv_head, (void)st, (void)sink, (void)from, (void)to;
}
static void st_reset(Selector *s, int layer) { (void)s, (void)layer; }
static size_t st_scratch(const Selector *s, int max_n) { return (void)s, (void)max_n, 0; }
static int st_select(const Selector *s, int layer, int kv_head, const float *q, int n, const SelectParams *sp, void *scratch, int *out) {
    (void)s, (void)layer, (void)kv_head, (void)q, (void)n, (void)sp, (void)scratch, (void)out;
    return 0;
}
static void st_destroy(Selector *s) { free(s); }

Selector *selector_streaming(char *err) {
    Selector *s = attn_calloc(1, sizeof *s, "the streaming selector", err);
    if (s) *s = (Selector){"streaming", st_extend, st_reset, st_scratch, st_select, st_destroy, NULL};
    return s;
}
