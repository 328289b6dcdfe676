// The chat templates of tokenizer/chat.h, each written out from the Jinja source it replaces
// (../shared/tokenizers/templates, SmolLM2's tokenizer_config.json). Jinja strings are Python
// strings, so the string methods below follow Python's: trim is str.strip() (Unicode white space),
// lstrip('\n') strips newlines only, split(x)[-1] is the text after the last x.
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat.h"
#include "tok_internal.h"

typedef struct {
    const char *p;
    size_t n;
} Span;

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} Str;

static Span span(const char *s) { return (Span){s, strlen(s)}; }

static void put(Str *s, Span t) {
    if (s->oom || tok_grow((void **)&s->p, &s->cap, s->n + t.n + 1, 1) < 0) {
        s->oom = 1;
        return;
    }
    memcpy(s->p + s->n, t.p, t.n);
    s->n += t.n;
    s->p[s->n] = '\0';
}
static void puts_(Str *s, const char *t) { put(s, span(t)); }

// Python's str.isspace().
static int py_space(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Jinja's trim: str.strip(). Spans are valid UTF-8 (checked on entry).
static Span trim(Span s) {
    size_t len;
    int32_t cp;
    while (s.n > 0 && utf8_scan((const uint8_t *)s.p, s.n, &len, &cp) == UTF8_VALID && py_space(cp)) s.p += len, s.n -= len;
    while (s.n > 0) {
        size_t start = s.n - 1;
        while (start > 0 && ((uint8_t)s.p[start] & 0xC0) == 0x80) start--; // back to the lead byte
        if (utf8_scan((const uint8_t *)s.p + start, s.n - start, &len, &cp) != UTF8_VALID || !py_space(cp)) break;
        s.n = start;
    }
    return s;
}

static Span lstrip_nl(Span s) {
    while (s.n > 0 && s.p[0] == '\n') s.p++, s.n--;
    return s;
}
static Span rstrip_nl(Span s) {
    while (s.n > 0 && s.p[s.n - 1] == '\n') s.n--;
    return s;
}

// First / last occurrence of needle in s, or NULL.
static const char *find(Span s, const char *needle) { return memmem(s.p, s.n, needle, strlen(needle)); }
static const char *find_last(Span s, const char *needle) {
    const char *last = NULL;
    for (const char *p = s.p; (p = memmem(p, s.n - (size_t)(p - s.p), needle, strlen(needle))); p++) last = p;
    return last;
}
static Span after(Span s, const char *at, const char *needle) {
    size_t skip = (size_t)(at - s.p) + strlen(needle);
    return (Span){s.p + skip, s.n - skip};
}

static int is_role(const ChatMessage *m, const char *role) { return strcmp(m->role, role) == 0; }

// The text of the Jinja string literal that ends at its quote q, starting at p; escapes undone.
static void jinja_literal(Str *out, const char *p, char q) {
    static const char esc_from[] = "ntr\\'\"", esc_to[] = "\n\t\r\\'\"";
    for (; *p && *p != q; p++) {
        const char *e = p[0] == '\\' && p[1] ? strchr(esc_from, p[1]) : NULL;
        char c = e ? esc_to[e - esc_from] : *p;
        p += e != NULL;
        put(out, (Span){&c, 1});
    }
}

// ---- Llama 3 ----

// "Today Date": --date, else what the template defaults to: strftime_now (3.2: today, as
// transformers defines it) or its date_string literal (3.1: "26 Jul 2024").
static void today_date(Str *o, const char *tpl, const ChatOptions *opt) {
    const char *lit = strstr(tpl, "date_string = \"");
    if (opt->date) {
        puts_(o, opt->date);
    } else if (strstr(tpl, "strftime_now")) {
        char buf[64];
        time_t now = time(NULL);
        struct tm tm;
        strftime(buf, sizeof buf, "%d %b %Y", localtime_r(&now, &tm));
        puts_(o, buf);
    } else if (lit) {
        jinja_literal(o, lit + strlen("date_string = \""), '"');
    } else {
        puts_(o, "26 Jul 2024");
    }
}

static void render_llama3(Str *o, const Tokenizer *t, const ChatMessage *m, int n, const ChatOptions *opt) {
    const char *tpl = tokenizer_chat_template(t), *knowledge = strstr(tpl, "Cutting Knowledge Date: ");
    size_t bos_len = 0;
    const char *bos = tokenizer_bos(t) >= 0 ? tokenizer_piece(t, tokenizer_bos(t), &bos_len) : NULL;
    put(o, (Span){bos ? bos : "", bos_len});
    if (knowledge) { // 3.1 and later: the system header comes first, with or without a system message
        Span sys = {"", 0};
        if (n > 0 && is_role(&m[0], "system")) sys = trim(span(m[0].content)), m++, n--;
        puts_(o, "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: ");
        knowledge += strlen("Cutting Knowledge Date: ");
        put(o, (Span){knowledge, strcspn(knowledge, "\\\"'\n")});
        puts_(o, "\nToday Date: ");
        today_date(o, tpl, opt);
        puts_(o, "\n\n");
        put(o, sys);
        puts_(o, "<|eot_id|>");
    }
    for (int i = 0; i < n; i++) {
        puts_(o, "<|start_header_id|>");
        puts_(o, m[i].role);
        puts_(o, "<|end_header_id|>\n\n");
        put(o, trim(span(m[i].content)));
        puts_(o, "<|eot_id|>");
    }
    puts_(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// ---- Qwen3 ----

static void im_block(Str *o, const char *role, Span content) {
    puts_(o, "<|im_start|>");
    puts_(o, role);
    puts_(o, "\n");
    put(o, content);
    puts_(o, "<|im_end|>\n");
}

// The last user message that is not a tool response: assistant turns after it keep their
// reasoning, earlier ones lose it.
static int last_query(const ChatMessage *m, int n) {
    for (int i = n - 1; i >= 0; i--) {
        Span c = span(m[i].content);
        int tool = c.n >= 31 && strncmp(c.p, "<tool_response>", 15) == 0 && strcmp(c.p + c.n - 16, "</tool_response>") == 0;
        if (is_role(&m[i], "user") && !tool) return i;
    }
    return n - 1;
}

static void qwen3_assistant(Str *o, Span content, int keep_reasoning, int last) {
    Span reasoning = {"", 0};
    const char *end = find(content, "</think>");
    if (end) {
        Span before = rstrip_nl((Span){content.p, (size_t)(end - content.p)});
        const char *open = find_last(before, "<think>");
        reasoning = lstrip_nl(open ? after(before, open, "<think>") : before);
        content = lstrip_nl(after(content, find_last(content, "</think>"), "</think>"));
    }
    puts_(o, "<|im_start|>assistant\n");
    if (keep_reasoning && (last || reasoning.n > 0)) {
        puts_(o, "<think>\n");
        put(o, rstrip_nl(lstrip_nl(reasoning)));
        puts_(o, "\n</think>\n\n");
        content = lstrip_nl(content);
    }
    put(o, content);
    puts_(o, "<|im_end|>\n");
}

static void render_qwen3(Str *o, const ChatMessage *m, int n, const ChatOptions *opt) {
    if (n > 0 && is_role(&m[0], "system")) im_block(o, "system", span(m[0].content));
    int query = last_query(m, n);
    for (int i = 0; i < n; i++) {
        if (is_role(&m[i], "user") || (is_role(&m[i], "system") && i > 0)) im_block(o, m[i].role, span(m[i].content));
        else if (is_role(&m[i], "assistant")) qwen3_assistant(o, span(m[i].content), i > query, i == n - 1);
    }
    puts_(o, "<|im_start|>assistant\n");
    if (opt->think == 0) puts_(o, "<think>\n\n</think>\n\n");
}

// ---- ChatML ----

// The system prompt the template adds when the conversation has none: the text of a literal
// '<|im_start|>system\n...<|im_end|>' in it (SmolLM2's, Qwen2.5's), or none.
static void chatml_default_system(Str *o, const char *tpl) {
    static const char head[] = "<|im_start|>system\n";
    for (const char *p = tpl; (p = strstr(p, "<|im_start|>system")); p++) {
        if (p == tpl || (p[-1] != '\'' && p[-1] != '"')) continue;
        Str lit = {0};
        jinja_literal(&lit, p, p[-1]);
        const char *end = lit.p ? strstr(lit.p, "<|im_end|>") : NULL;
        int found = end && strncmp(lit.p, head, strlen(head)) == 0 && end > lit.p + strlen(head);
        if (found) put(o, (Span){lit.p + strlen(head), (size_t)(end - lit.p) - strlen(head)});
        o->oom |= lit.oom;
        free(lit.p);
        if (found) return;
    }
}

static void render_chatml(Str *o, const Tokenizer *t, const ChatMessage *m, int n) {
    if (n > 0 && !is_role(&m[0], "system")) {
        Str sys = {0};
        chatml_default_system(&sys, tokenizer_chat_template(t));
        if (sys.n) im_block(o, "system", (Span){sys.p, sys.n});
        o->oom |= sys.oom;
        free(sys.p);
    }
    for (int i = 0; i < n; i++) im_block(o, m[i].role, span(m[i].content));
    puts_(o, "<|im_start|>assistant\n");
}

// ---- entry ----

static int valid_utf8(const char *s) {
    size_t n = strlen(s), len;
    int32_t cp;
    for (size_t i = 0; i < n; i += len)
        if (utf8_scan((const uint8_t *)s + i, n - i, &len, &cp) != UTF8_VALID) return 0;
    return 1;
}

char *chat_render(const Tokenizer *t, const ChatMessage *m, int n, const ChatOptions *opt, char *err) {
    int kind = tokenizer_chat(t);
    if (kind == TOK_CHAT_NONE || !tokenizer_chat_template(t)) {
        snprintf(err, TOK_ERR_LEN, "the model has no chat template this runner renders (Llama 3, Qwen3, ChatML)");
        return NULL;
    }
    if (n < 1) {
        snprintf(err, TOK_ERR_LEN, "the conversation has no messages");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (!m[i].role || !m[i].content || !(is_role(&m[i], "system") || is_role(&m[i], "user") || is_role(&m[i], "assistant"))) {
            snprintf(err, TOK_ERR_LEN, "message %d: the role must be system, user or assistant", i + 1);
            return NULL;
        }
        if (!valid_utf8(m[i].content)) {
            snprintf(err, TOK_ERR_LEN, "message %d: the content is not valid UTF-8", i + 1);
            return NULL;
        }
    }
    Str o = {0};
    if (kind == TOK_CHAT_LLAMA3) render_llama3(&o, t, m, n, opt);
    else if (kind == TOK_CHAT_QWEN3) render_qwen3(&o, m, n, opt);
    else render_chatml(&o, t, m, n);
    if (o.oom) {
        free(o.p);
        snprintf(err, TOK_ERR_LEN, "out of memory rendering the conversation");
        return NULL;
    }
    return o.p;
}
