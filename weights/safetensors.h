// safetensors reader: one or many files of a Hugging Face checkpoint, as one tensor directory.
#ifndef SAFETENSORS_H
#define SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_ERR_LEN 512

enum StDType { ST_F32 = 0, ST_F16 = 1, ST_BF16 = 2 };

typedef struct {
    char *name;
    int dtype;          // StDType
    int ndim;
    uint64_t shape[4];
    uint64_t n_elems;
    const uint8_t *data;
} StTensor;

typedef struct {
    int n_files;
    const uint8_t **maps;
    size_t *sizes;
    int n_tensors;
    StTensor *tensors;
} StModel;

// Opens dir's checkpoint: the files listed by model.safetensors.index.json, or model.safetensors.
int st_open_dir(StModel *m, const char *dir, char *err);
void st_close(StModel *m);
const StTensor *st_find(const StModel *m, const char *name);
// Converts a tensor to fp32.
void st_to_f32(const StTensor *t, float *out);

#endif
