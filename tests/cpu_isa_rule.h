// The products' instruction-set rule (model/cpu_isa.h), written out apart from cpu_isa.c for the
// tests that check cpu_isa() against it (test_dot_bf16, test_gemm_dnnl): without PKV_CPU_ISA this
// CPU's best set; the set named where the CPU has it (fp32: the best of generic, avx2, avx512);
// else the best.
#ifndef CPU_ISA_RULE_H
#define CPU_ISA_RULE_H

#include <string.h>

#include "../model/cpu_isa.h"

// The set the rule gives for PKV_CPU_ISA = env (NULL or empty: unset).
static inline CpuIsa cpu_isa_rule(const char *env) {
    CpuIsa best = cpu_isa_best();
    if (!env || !*env) return best;
    if (strcmp(env, "fp32") == 0) return best < CPU_ISA_AVX512 ? best : CPU_ISA_AVX512;
    int want = cpu_isa_parse(env);
    return want >= 0 && want <= (int)best ? (CpuIsa)want : best;
}

#endif
