// model.bin: one file holding a model's configuration, tokenizer and weights.
//
// Layout (all little-endian):
//   FileHeader                      magic, version, Config, where the sections are
//   tokenizer section               tokenizer_write() bytes (tokenizer/tokenizer.h)
//   TensorEntry[n_tensors]          name, dtype, shape, offset, size of each tensor
//   tensor data                     each tensor starts on a MODEL_ALIGN boundary, so mapping the
//                                   file gives aligned, directly usable weights
// Format 1: every matrix in Config.weight_dtype. Format 2 (written only when some matrix is
// quantized): each matrix in weight_dtype or in Q8_0 / Q4_K blocks, its entry's dtype saying which
// (model/quant.h). The reader takes both.
// The runner maps the file read-only and never copies the weights.
#ifndef MODELFILE_H
#define MODELFILE_H

#include <stddef.h>
#include <stdint.h>
#include "config.h"

#define MODEL_MAGIC "PARISKV1"
#define MODEL_VERSION 2     // the newest format (what --version reports)
#define MODEL_VERSION_MIN 1 // the oldest this reader takes
#define MODEL_ALIGN 4096
#define TENSOR_NAME_LEN 48
#define MODEL_ERR_LEN 512

typedef struct {
    char magic[8];            // MODEL_MAGIC, not NUL-terminated
    uint32_t version;         // MODEL_VERSION_MIN .. MODEL_VERSION
    uint32_t header_size;     // sizeof(FileHeader), a check that writer and reader agree
    Config config;
    uint64_t tokenizer_offset;
    uint64_t tokenizer_size;
    uint64_t tensors_offset;  // the TensorEntry table
    uint32_t n_tensors;
    uint32_t pad;
    uint64_t file_size;       // total bytes, so truncation is detected before anything is read
} FileHeader;

typedef struct {
    char name[TENSOR_NAME_LEN]; // NUL-terminated, e.g. "blk.3.attn_q"
    uint32_t dtype;             // DType (a matrix may be quantized in format 2)
    uint32_t ndim;              // 1 or 2
    uint64_t shape[2];          // shape[0] rows (outputs), shape[1] columns (inputs); 1-D: shape[0]
    uint64_t offset;            // from the start of the file, MODEL_ALIGN-aligned
    uint64_t nbytes;            // shape[0] * dtype_row_bytes(dtype, shape[1])
} TensorEntry;

// The tensors a model of this configuration must have, in file order. Names follow GGUF.
// Calls fn(name, dtype, ndim, rows, cols, ctx) for each; returns the count. dtype is the one
// the configuration implies (weight_dtype for the 2-D matrices, F32 for the vectors).
typedef void (*TensorVisitor)(const char *name, uint32_t dtype, uint32_t ndim, uint64_t rows, uint64_t cols, void *ctx);
int model_tensor_list(const Config *c, TensorVisitor fn, void *ctx);

// Checks a configuration for sane, self-consistent values. Returns 0, or -1 with err filled.
int config_validate(const Config *c, char *err);
// Are the sampling defaults (generation_config.json's) absent or within the ranges ./run accepts?
int config_sampling_valid(const Config *c);

// A mapped model file.
typedef struct {
    const uint8_t *data;      // the whole file, mapped read-only
    size_t size;
    const FileHeader *header;
    const TensorEntry *tensors;
    int fd;
} ModelFile;

// Maps and validates path: magic, version, sizes, config, every tensor's presence, dtype,
// shape and bounds. Returns 0, or -1 with a one-line message in err.
int modelfile_open(ModelFile *mf, const char *path, char *err);
void modelfile_close(ModelFile *mf);
// Pointer to a validated tensor's data, or NULL if the model has no tensor of that name.
const void *modelfile_tensor(const ModelFile *mf, const char *name);
// Its table entry (dtype, shape), or NULL.
const TensorEntry *modelfile_entry(const ModelFile *mf, const char *name);

// Writing (used by ./export). Data goes to "<path>.tmp" and is renamed into place only by
// modelwriter_finish, so a failed export never leaves a file that looks valid.
typedef struct ModelWriter ModelWriter;
// dtypes: each tensor's dtype in model_tensor_list order (a matrix may be Q8_0 or Q4_K when its
// rows are whole blocks), or NULL for the configuration's own.
ModelWriter *modelwriter_create(const char *path, const Config *c, const void *tokenizer, size_t tokenizer_size,
                                const uint32_t *dtypes, char *err);
// Adds the next tensor (must come in model_tensor_list order); data holds rows*cols floats,
// converted to (quantized into) the tensor's dtype on write.
int modelwriter_add(ModelWriter *w, const char *name, const float *data, char *err);
// The same with data already in the tensor's dtype: rows * dtype_row_bytes bytes, copied as is.
int modelwriter_add_raw(ModelWriter *w, const char *name, const void *data, char *err);
// The next tensor's entry (its dtype and shape), or NULL when all are written.
const TensorEntry *modelwriter_next(const ModelWriter *w);
int modelwriter_finish(ModelWriter *w, char *err);
void modelwriter_abort(ModelWriter *w); // removes the temporary file

#endif
