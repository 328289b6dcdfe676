// safetensors: an 8-byte header length, a JSON header {name: {dtype, shape, data_offsets}}, then data.
#include "safetensors.h"
#include "../model/errmsg.h"
#include "../model/guard.h"
#include "../model/bf16.h"
#include "hf_config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define fail(err, ...) err_fail(err, ST_ERR_LEN, __VA_ARGS__)

// A JSON number that is a whole count below 2^53 (doubles are exact there). 0, or -1.
static int json_u64(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < 9007199254740992.0)) return -1;
    *out = (uint64_t)v->valuedouble;
    return (double)*out == v->valuedouble ? 0 : -1;
}

// Adds the tensors of one file to m.
static int add_file(StModel *m, const char *path, char *err) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); // O_NONBLOCK: a FIFO cannot hang us
    if (fd < 0) return fail(err, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 8) {
        close(fd);
        return fail(err, "'%s' is not a safetensors file (not a regular file of at least 8 bytes)", path);
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return fail(err, "cannot map '%s': %s", path, strerror(errno));
    const uint8_t **maps = realloc(m->maps, sizeof(*maps) * (size_t)(m->n_files + 1));
    size_t *sizes = realloc(m->sizes, sizeof(*sizes) * (size_t)(m->n_files + 1));
    if (maps) m->maps = maps;
    if (sizes) m->sizes = sizes;
    if (!maps || !sizes) {
        munmap(map, size);
        return fail(err, "out of memory");
    }
    m->maps[m->n_files] = map;
    m->sizes[m->n_files] = size;
    m->n_files++;
    guard_map(map, size, path);

    uint64_t hlen;
    memcpy(&hlen, map, 8);
    if (hlen > size - 8) return fail(err, "'%s' is truncated: header of %llu bytes in a %zu-byte file", path,
                                     (unsigned long long)hlen, size);
    cJSON *h = cJSON_ParseWithLength((const char *)map + 8, (size_t)hlen);
    if (!h || !cJSON_IsObject(h)) {
        cJSON_Delete(h);
        return fail(err, "'%s': header is not valid JSON", path);
    }
    const uint8_t *base = (const uint8_t *)map + 8 + hlen;
    uint64_t data_size = size - 8 - hlen;
    int rc = 0;
    for (cJSON *e = h->child; e && rc == 0; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        cJSON *dt = cJSON_GetObjectItem(e, "dtype"), *sh = cJSON_GetObjectItem(e, "shape"),
              *off = cJSON_GetObjectItem(e, "data_offsets");
        if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2) {
            rc = fail(err, "'%s': tensor '%s' has a malformed entry", path, e->string);
            break;
        }
        StTensor t = {0};
        size_t esize;
        if (strcmp(dt->valuestring, "F32") == 0) t.dtype = ST_F32, esize = 4;
        else if (strcmp(dt->valuestring, "F16") == 0) t.dtype = ST_F16, esize = 2;
        else if (strcmp(dt->valuestring, "BF16") == 0) t.dtype = ST_BF16, esize = 2;
        else {
            rc = fail(err, "'%s': tensor '%s' has dtype %s (supported: F32, F16, BF16)", path, e->string, dt->valuestring);
            break;
        }
        t.ndim = cJSON_GetArraySize(sh);
        if (t.ndim > 4) {
            rc = fail(err, "'%s': tensor '%s' has %d dimensions", path, e->string, t.ndim);
            break;
        }
        t.n_elems = 1;
        for (int d = 0; d < t.ndim && rc == 0; d++) {
            uint64_t v = 0;
            if (json_u64(cJSON_GetArrayItem(sh, d), &v) != 0 || (v && t.n_elems > (1ull << 42) / v))
                rc = fail(err, "'%s': tensor '%s' has a bad shape", path, e->string);
            t.shape[d] = v;
            t.n_elems *= v;
        }
        uint64_t b = 0, en = 0;
        if (rc == 0 && (json_u64(cJSON_GetArrayItem(off, 0), &b) != 0 || json_u64(cJSON_GetArrayItem(off, 1), &en) != 0 ||
                        en < b || en > data_size || en - b != t.n_elems * esize))
            rc = fail(err, "'%s' is truncated or damaged: tensor '%s' data_offsets do not hold its %llu bytes within the %llu bytes of data",
                      path, e->string, (unsigned long long)(t.n_elems * esize), (unsigned long long)data_size);
        if (rc != 0) break;
        t.data = base + b;
        t.name = strdup(e->string);
        StTensor *nt = realloc(m->tensors, sizeof(StTensor) * (size_t)(m->n_tensors + 1));
        if (!t.name || !nt) {
            free(t.name);
            rc = fail(err, "out of memory");
            break;
        }
        m->tensors = nt;
        m->tensors[m->n_tensors++] = t;
    }
    cJSON_Delete(h);
    return rc;
}

int st_open_dir(StModel *m, const char *dir, char *err) {
    memset(m, 0, sizeof *m);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, F_OK) == 0) {
        char *text = read_text_file(path, err);
        if (!text) return -1;
        cJSON *j = cJSON_Parse(text);
        free(text);
        cJSON *wm = j ? cJSON_GetObjectItem(j, "weight_map") : NULL;
        if (!cJSON_IsObject(wm)) {
            cJSON_Delete(j);
            return fail(err, "'%s': no weight_map object", path);
        }
        // The distinct shard names, each opened once.
        char **seen = NULL;
        int n_seen = 0, rc = 0;
        for (cJSON *e = wm->child; e && rc == 0; e = e->next) {
            if (!cJSON_IsString(e) || strchr(e->valuestring, '/')) {
                rc = fail(err, "'%s': bad shard name for '%s'", path, e->string);
                break;
            }
            int dup = 0;
            for (int i = 0; i < n_seen && !dup; i++) dup = strcmp(seen[i], e->valuestring) == 0;
            if (dup) continue;
            char **ns = realloc(seen, sizeof(char *) * (size_t)(n_seen + 1));
            if (!ns) { rc = fail(err, "out of memory"); break; }
            seen = ns;
            seen[n_seen++] = e->valuestring;
            char shard[4096];
            snprintf(shard, sizeof shard, "%s/%s", dir, e->valuestring);
            rc = add_file(m, shard, err);
        }
        free(seen);
        cJSON_Delete(j);
        if (rc != 0) st_close(m);
        return rc;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (access(path, F_OK) != 0)
        return fail(err, "'%s' has no model.safetensors or model.safetensors.index.json", dir);
    int rc = add_file(m, path, err);
    if (rc != 0) st_close(m);
    return rc;
}

void st_close(StModel *m) {
    for (int i = 0; i < m->n_files; i++) guard_unmap(m->maps[i]), munmap((void *)m->maps[i], m->sizes[i]);
    for (int i = 0; i < m->n_tensors; i++) free(m->tensors[i].name);
    free(m->maps);
    free(m->sizes);
    free(m->tensors);
    memset(m, 0, sizeof *m);
}

const StTensor *st_find(const StModel *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

void st_to_f32(const StTensor *t, float *out) {
    const uint8_t *p = t->data;
    for (uint64_t i = 0; i < t->n_elems; i++) {
        uint16_t h;
        switch (t->dtype) {
        case ST_F32: memcpy(&out[i], p + 4 * i, 4); break;
        case ST_F16: memcpy(&h, p + 2 * i, 2); out[i] = f16_to_f32(h); break;
        default: memcpy(&h, p + 2 * i, 2); out[i] = bf16_to_f32(h); break;
        }
    }
}
