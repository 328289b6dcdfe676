// C interface to the SentencePiece library (see spm.h). No C++ exception may cross into C, so
// every entry point catches everything (allocation failures included) and reports it in err.
#include "spm.h"

#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define SPM_ERR_LEN 256 // TOK_ERR_LEN: this file does not include the C headers

struct SpmModel {
    sentencepiece::SentencePieceProcessor sp;
};

extern "C" SpmModel *spm_load(const void *proto, size_t len, char *err) {
    try {
        SpmModel *m = new SpmModel;
        auto st = m->sp.LoadFromSerializedProto(std::string(static_cast<const char *>(proto), len));
        if (st.ok() && m->sp.GetPieceSize() > 0) return m;
        snprintf(err, SPM_ERR_LEN, "tokenizer: not a SentencePiece model (%.160s)", st.ok() ? "no pieces" : st.message());
        delete m;
    } catch (...) {
        snprintf(err, SPM_ERR_LEN, "tokenizer: out of memory loading the SentencePiece model");
    }
    return nullptr;
}

extern "C" void spm_free(SpmModel *m) { delete m; }

extern "C" int spm_n_pieces(const SpmModel *m) { return m->sp.GetPieceSize(); }

extern "C" const char *spm_piece(const SpmModel *m, int id, size_t *len) {
    const std::string &p = m->sp.IdToPiece(id);
    *len = p.size();
    return p.data();
}

extern "C" int spm_piece_type(const SpmModel *m, int id) {
    if (m->sp.IsUnknown(id)) return SPM_PIECE_UNKNOWN;
    if (m->sp.IsControl(id)) return SPM_PIECE_CONTROL;
    if (m->sp.IsByte(id)) return SPM_PIECE_BYTE;
    if (m->sp.IsUnused(id)) return SPM_PIECE_UNUSED;
    return SPM_PIECE_NORMAL;
}

extern "C" int spm_bos(const SpmModel *m) { return m->sp.bos_id(); }
extern "C" int spm_eos(const SpmModel *m) { return m->sp.eos_id(); }

extern "C" long spm_encode(const SpmModel *m, const char *text, size_t len, int **ids, char *err) {
    *ids = nullptr;
    try {
        std::vector<int> v;
        auto st = m->sp.Encode(std::string(text, len), &v);
        if (!st.ok()) {
            snprintf(err, SPM_ERR_LEN, "tokenizer: SentencePiece: %.200s", st.message());
            return -1;
        }
        *ids = static_cast<int *>(malloc((v.size() + 1) * sizeof(int))); // +1: valid even when empty
        if (!*ids) throw std::bad_alloc();
        if (!v.empty()) memcpy(*ids, v.data(), v.size() * sizeof(int));
        return static_cast<long>(v.size());
    } catch (...) {
        snprintf(err, SPM_ERR_LEN, "tokenizer: out of memory encoding %zu bytes", len);
        return -1;
    }
}
