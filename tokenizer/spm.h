// The SentencePiece library (C++, Debian's libsentencepiece) behind a small C interface.
// spm.cc is the only C++ in tokenizer/: a model proto in, ids and pieces out.
#ifndef SPM_H
#define SPM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct SpmModel SpmModel;

enum SpmPieceType { SPM_PIECE_NORMAL = 0, SPM_PIECE_UNKNOWN, SPM_PIECE_CONTROL, SPM_PIECE_BYTE, SPM_PIECE_UNUSED };

// Parses a serialized ModelProto (the bytes of a tokenizer.model). NULL with err (TOK_ERR_LEN
// bytes) filled when the bytes are not a SentencePiece model.
SpmModel *spm_load(const void *proto, size_t len, char *err);
void spm_free(SpmModel *m);

int spm_n_pieces(const SpmModel *m);
const char *spm_piece(const SpmModel *m, int id, size_t *len); // the piece as stored ("▁the", "<0x0A>")
int spm_piece_type(const SpmModel *m, int id);                  // SpmPieceType
int spm_bos(const SpmModel *m);                                 // -1 if the model has none
int spm_eos(const SpmModel *m);

// Encodes text exactly as spm_encode does (normalization, dummy prefix, byte fallback: whatever
// the model's spec says). *ids is malloc'd; returns the count, or -1 with err filled.
long spm_encode(const SpmModel *m, const char *text, size_t len, int **ids, char *err);

#ifdef __cplusplus
}
#endif

#endif
