// A saved session (--save-session / --load-session): a sequence's tokens, the K/V of its
// positions and the logits after its last one, so that a long prompt is prefilled once and later
// runs resume from it. The file: a versioned header with checksums, the identity of the model it
// was made with and the attention settings it was made under (a session only makes sense with
// both), then the sections, each on a SESSION_ALIGN boundary:
//   tokens  int32 (n_tokens)
//   logits  fp32 (vocab_size): the next-token logits after the last token (a prompt's session)
//   chat    a chat's messages (a chat's session): per message a role byte ('s', 'u', 'a'), its
//           length (uint32) and its UTF-8 text
//   kv      the K/V of positions 0 .. n_tokens-1 in one of two formats:
//           kv_format 1 (the CPU path): per layer, the K rows then the V rows, fp32
//             (n_kv_heads * head_dim each) -- the CPU cache as it is;
//           kv_format 2 (the GPU path, SessionGpuLayout): the retrieval zone's rows as host-store
//             slots (offload/host_store.h: bf16, or fp8 under --kv-store-dtype fp8), then the
//             rows the device cache needs exactly (the sink, the local window), bf16.
// The attention policy's index is not saved: on load it is rebuilt from the rows at the next
// step (the same keys give the same index); what it cannot rebuild -- which zone rows it already
// rewrote with their fp8 values -- the header keeps.
#ifndef SESSION_H
#define SESSION_H

#include <stdint.h>

#include "../attention/attention.h"
#include "model.h"

#define SESSION_MAGIC "PKVSESS1"
#define SESSION_VERSION 1
#define SESSION_ALIGN 4096
#define SESSION_KV_CPU_F32 1
#define SESSION_KV_GPU 2
#define SESSION_PIECE ((uint64_t)64 << 20) // a GPU K/V section is checksummed in pieces of this many bytes
#define SESSION_PROMPT 1 // saved after a prompt (--save-session): resumed by a generation
#define SESSION_CHAT 2   // saved by /save in a chat: resumed by --chat

typedef struct {
    char magic[8];            // SESSION_MAGIC, not NUL-terminated
    uint32_t version;         // SESSION_VERSION
    uint32_t header_size;     // sizeof(SessionHeader)
    uint64_t model_id;        // session_model_id() of the model it was made with
    Config config;            // that model's configuration (for the messages)
    uint32_t kv_format;       // SESSION_KV_CPU_F32 or SESSION_KV_GPU
    int32_t attn_method, topk, sink, local, update, dense_min, zone_fp8;
    float beta, rho;
    int32_t n_tokens;         // positions in the session
    int32_t prefill_len;      // the prompt's length (ParisKV's regions depend on it)
    int32_t fp8_end;          // zone_fp8: rows below it already hold their fp8 values
    int32_t kind;             // SESSION_PROMPT or SESSION_CHAT
    uint64_t tokens_offset, logits_offset, chat_offset, chat_bytes, kv_offset, kv_bytes, file_size;
    uint64_t tokens_sum, logits_sum, chat_sum, kv_sum; // session_checksum() of each section
    uint64_t header_sum;      // of this header with header_sum = 0
} SessionHeader;

#define SESSION_ERR_LEN 512

// A 64-bit checksum of n bytes (not cryptographic: it catches damage, not forgery).
uint64_t session_checksum(const void *p, size_t n);
// The identity of a loaded model: its header, tokenizer and tensor table, and the first 4 KiB
// of every tensor (two fine-tunes of one shape differ there). A --synthetic model (no file):
// its configuration and dtypes (its random weights are a function of them).
uint64_t session_model_id(const Model *m);

// The GPU format's K/V section for n positions under the attention settings a (prefill_len as
// the session's), a function of those alone so that any GPU state -- zone in the host store or
// in device memory, any device-cache size -- writes and reads the same bytes:
//   zone:   under ParisKV past its dense phase, positions [sink, n) as host-store slots
//           (slot i = position sink + i: per layer and KV head one row, key then value), padded
//           to SESSION_ALIGN; empty otherwise
//   window: per layer, the K then the V rows, per KV head, of positions [0, win_a) then
//           [win_b, n), bf16: the sink and the local window (exact even when the zone is fp8),
//           or every position when the run is dense (full attention, or still in the dense phase)
typedef struct SessionGpuLayout {
    int n, zone_from, zone_slots;
    uint64_t row_bytes;   // one zone row: host_store_row_bytes(head_dim, fp8)
    uint64_t slot_bytes;  // n_layers * n_kv_heads * row_bytes
    uint64_t zone_bytes;  // zone_slots * slot_bytes, rounded up to SESSION_ALIGN
    int win_a, win_b, win_rows; // win_rows = win_a + n - win_b
    uint64_t win_bytes;   // 2 * n_layers * n_kv_heads * win_rows * head_dim * 2
    int fp8;
} SessionGpuLayout;
void session_gpu_layout(const Config *c, const AttnConfig *a, int n, SessionGpuLayout *L);

// The K/V section as a stream of bytes in the layout's order: a backend writes it with put and
// reads it back with get (into its own memory: no copy through a buffer of the stream's), and
// the stream keeps the section's checksum (session_checksum of each SESSION_PIECE-byte piece,
// folded in order, whatever sizes the calls come in). Large calls are read and checksummed by
// several threads.
typedef struct SessionStream SessionStream;
int session_put(SessionStream *s, const void *p, size_t n); // 0, or -1 (the stream holds the error)
int session_get(SessionStream *s, void *p, size_t n);

// Bytes of the session file of n positions (chat_bytes of conversation) in kv_format, and a
// check that the directory of path has that much free disk (0, or -1 with the numbers in err).
uint64_t session_bytes(const Config *c, const AttnConfig *a, uint32_t kv_format, int n, int prefill_len, size_t chat_bytes);
int session_check_disk(const char *path, uint64_t bytes, char *err);

// What a session holds besides the tokens and the K/V.
typedef struct {
    int kind;              // SESSION_PROMPT or SESSION_CHAT
    int prefill_len;       // the prompt's length
    int fp8_end;           // attn_policy_fp8_end() (0 without a policy)
    const float *logits;   // (vocab) after the last token; NULL: zeros (a chat's)
    const void *chat;      // the chat section (SESSION_CHAT), chat_bytes long
    size_t chat_bytes;
} SessionExtra;

// Writes the session of tokens[0..n) from the state s (positions 0..n-1 in its cache; a GPU state
// writes through its backend's session_save). 0, or -1 with err filled (nothing is left at path:
// the file is written aside and renamed).
int session_save(const char *path, const Model *m, const RunState *s, const AttnConfig *a, const int *tokens, int n, const SessionExtra *x,
                 char *err);

// Reads and checks the header of path against the model, the path that loads it (gpu: 1 the GPU's,
// 0 the CPU's, -1 either) and the attention settings (and the file's size); fills h. 0, or -1
// with a one-line err.
int session_open(const char *path, const Model *m, const AttnConfig *a, int gpu, SessionHeader *h, char *err);
// The header's own checks, given the model's identity and configuration (what session_open
// runs after reading it; the fuzz harness calls it on any bytes).
int session_check_header(const SessionHeader *h, uint64_t file_size, uint64_t model_id, const Config *c, const AttnConfig *a, int gpu,
                         char *err);

// Whether the session's format is the path's that loads it (gpu: a whole-pass backend's state):
// 0, or -1 with a one-line err saying which path to load it with.
int session_check_path(const SessionHeader *h, int gpu, const char *path, char *err);

// After session_open: reads the tokens (into tokens, n_tokens of them), the logits (vocab), the
// chat section (malloc'd into *chat, NULL when empty) and the K/V into s's cache (s->ctx >=
// n_tokens; a GPU state through its backend's session_load), checking each section's checksum.
// The session's format must be the state's path's. 0, or -1.
int session_read(const char *path, const SessionHeader *h, RunState *s, int *tokens, float *logits, void **chat, char *err);

#endif
