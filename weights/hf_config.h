// Hugging Face config.json and generation_config.json → Config.
#ifndef HF_CONFIG_H
#define HF_CONFIG_H

#include "../model/config.h"

// Reads dir/config.json (transformers 4.x `rope_theta`/`rope_scaling` and 5.x `rope_parameters`
// forms) and, when present, dir/generation_config.json. Returns 0, or -1 with err filled.
int hf_read_config(const char *dir, Config *c, char *err);

// Reads a whole small text file into a malloc'd NUL-terminated string; NULL with err on failure.
char *read_text_file(const char *path, char *err);

#endif
