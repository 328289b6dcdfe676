// Hugging Face configuration files.
#include "hf_config.h"
#include "../model/modelfile.h"
#include "../model/errmsg.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ERR_LEN 512

#define fail(err, ...) err_fail(err, ERR_LEN, __VA_ARGS__)

// Reads exactly n bytes (a file that shrinks meanwhile is an error). 0, or -1.
static int read_all(int fd, char *buf, size_t n) {
    while (n > 0) {
        ssize_t k = read(fd, buf, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        buf += k, n -= (size_t)k;
    }
    return 0;
}

char *read_text_file(const char *path, char *err) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); // O_NONBLOCK: a FIFO cannot hang us
    if (fd < 0) return fail(err, "cannot open '%s': %s", path, strerror(errno)), NULL;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size >= (1L << 30)) {
        close(fd);
        return fail(err, "'%s' is not a regular file under 1 GiB", path), NULL;
    }
    size_t n = (size_t)st.st_size;
    char *s = malloc(n + 1);
    if (!s || read_all(fd, s, n) != 0) {
        free(s);
        close(fd);
        return fail(err, "cannot read '%s' (%zu bytes)", path, n), NULL;
    }
    close(fd);
    s[n] = 0;
    return s;
}

// Numeric field: 0 if present and a number (value in *out), 1 if absent or null, -1 if another type.
static int num(const cJSON *o, const char *key, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 1;
    if (!cJSON_IsNumber(v)) return -1;
    *out = v->valuedouble;
    return 0;
}

static int need_u32(const cJSON *o, const char *key, uint32_t *out, const char *path, char *err) {
    double d;
    int r = num(o, key, &d);
    if (r != 0 || d < 0 || d > 4294967295.0 || d != (double)(uint32_t)d)
        return fail(err, "'%s': \"%s\" is %s", path, key, r == 1 ? "missing" : "not a valid count");
    *out = (uint32_t)d;
    return 0;
}

// An optional count: *out unchanged when absent. 0, or -1 with err when present but not a count
// (a double outside uint32 must never reach the conversion: that is undefined behaviour).
static int opt_u32(const cJSON *o, const char *key, uint32_t *out, const char *path, char *err) {
    double d;
    return num(o, key, &d) == 1 ? 0 : need_u32(o, key, out, path, err);
}

static int flag(const cJSON *o, const char *key, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

// RoPE: 5.x nests everything in rope_parameters; 4.x has rope_theta and an optional rope_scaling.
static int read_rope(const cJSON *j, Config *c, const char *path, char *err) {
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    const cJSON *sc = cJSON_IsObject(rp) ? rp : cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    double theta;
    if (num(cJSON_IsObject(rp) ? rp : j, "rope_theta", &theta) != 0)
        return fail(err, "'%s': no rope_theta (neither top-level nor in rope_parameters)", path);
    c->rope_theta = (float)theta;
    c->rope_scaling = ROPE_SCALING_NONE;
    if (!cJSON_IsObject(sc)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(sc, "rope_type");
    if (!cJSON_IsString(type)) type = cJSON_GetObjectItemCaseSensitive(sc, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "default";
    if (strcmp(t, "default") == 0) return 0;
    if (strcmp(t, "llama3") != 0)
        return fail(err, "'%s': RoPE scaling type '%s' is not supported (supported: default, llama3)", path, t);
    double f, lo, hi;
    if (num(sc, "factor", &f) || num(sc, "low_freq_factor", &lo) || num(sc, "high_freq_factor", &hi))
        return fail(err, "'%s': llama3 RoPE scaling lacks factor or low/high_freq_factor", path);
    if (need_u32(sc, "original_max_position_embeddings", &c->rope_orig_ctx, path, err)) return -1;
    c->rope_scaling = ROPE_SCALING_LLAMA3;
    c->rope_factor = (float)f;
    c->rope_low_freq = (float)lo;
    c->rope_high_freq = (float)hi;
    return 0;
}

// Sampling defaults. transformers' own defaults apply to absent fields (top_k 50, top_p 1, temperature 1).
static void read_generation(const char *dir, Config *c) {
    char path[4096], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (access(path, F_OK) != 0) return;
    char *text = read_text_file(path, err);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!cJSON_IsObject(j)) {
        fprintf(stderr, "warning: ignoring unreadable %s\n", path);
        cJSON_Delete(j);
        return;
    }
    double d;
    c->has_gen_defaults = 1;
    c->gen_do_sample = (uint32_t)flag(j, "do_sample", 0);
    c->gen_temperature = num(j, "temperature", &d) == 0 ? (float)d : 1.0f;
    c->gen_top_p = num(j, "top_p", &d) == 0 ? (float)d : 1.0f;
    c->gen_top_k = num(j, "top_k", &d) != 0 ? 50 : d >= 0 && d <= INT32_MAX ? (int32_t)d : -1; // -1: refused below
    c->gen_min_p = num(j, "min_p", &d) == 0 ? (float)d : 0.0f;
    cJSON_Delete(j);
    if (!config_sampling_valid(c)) {
        fprintf(stderr, "warning: ignoring %s: its sampling settings are out of range\n", path);
        c->has_gen_defaults = 0;
    }
}

int hf_read_config(const char *dir, Config *c, char *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = read_text_file(path, err);
    if (!text) return -1;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return fail(err, "'%s' is not valid JSON", path);
    }
    memset(c, 0, sizeof *c);
    int rc = -1;
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    const char *arch = cJSON_IsString(a0) ? a0->valuestring : NULL;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
    double d;
    if (!arch) {
        fail(err, "'%s': no \"architectures\" entry", path);
    } else if (strcmp(arch, "LlamaForCausalLM") != 0 && strcmp(arch, "Qwen3ForCausalLM") != 0) {
        fail(err, "'%s': architecture '%s' is not supported (supported: LlamaForCausalLM, Qwen3ForCausalLM)", path, arch);
    } else if (cJSON_IsString(act) && strcmp(act->valuestring, "silu") != 0) {
        fail(err, "'%s': activation '%s' is not supported (only silu)", path, act->valuestring);
    } else if (flag(j, "attention_bias", 0) || flag(j, "mlp_bias", 0)) {
        fail(err, "'%s': attention_bias / mlp_bias are not supported", path);
    } else if (need_u32(j, "num_hidden_layers", &c->n_layers, path, err) ||
               need_u32(j, "hidden_size", &c->dim, path, err) ||
               need_u32(j, "num_attention_heads", &c->n_heads, path, err) ||
               need_u32(j, "intermediate_size", &c->hidden_dim, path, err) ||
               need_u32(j, "vocab_size", &c->vocab_size, path, err) ||
               need_u32(j, "max_position_embeddings", &c->max_seq_len, path, err) ||
               read_rope(j, c, path, err)) {
        // err says what
    } else if (num(j, "rms_norm_eps", &d) != 0) {
        fail(err, "'%s': \"rms_norm_eps\" is missing", path);
    } else {
        c->arch = strcmp(arch, "Qwen3ForCausalLM") == 0 ? ARCH_QWEN3 : ARCH_LLAMA;
        c->norm_eps = (float)d;
        c->n_kv_heads = c->n_heads;
        c->head_dim = c->n_heads ? c->dim / c->n_heads : 0;
        rc = opt_u32(j, "num_key_value_heads", &c->n_kv_heads, path, err) || opt_u32(j, "head_dim", &c->head_dim, path, err) ? -1 : 0;
        c->qk_norm = c->arch == ARCH_QWEN3;
        c->tied_embeddings = (uint32_t)flag(j, "tie_word_embeddings", 0);
        c->weight_dtype = DTYPE_BF16;
    }
    cJSON_Delete(j);
    if (rc == 0) read_generation(dir, c);
    return rc;
}
