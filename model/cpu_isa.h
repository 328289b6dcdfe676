// Which vector instructions the CPU path's products use, chosen at run time so one binary serves
// any x86-64: cpuid says what the processor has, xgetbv whether the kernel saves those registers.
// The kernels for every set are always built (per-function target attributes); a CPU that lacks
// a set never calls its functions.
//
// PKV_CPU_ISA=generic|avx2|avx512|avx512bf16 picks one (tests force each path so); a set the CPU
// lacks falls back to the best it has, with a warning. Without it the default is the best of
// generic, avx2 and avx512: those multiply the fp32 activations as they are. avx512bf16 rounds the
// activations to bf16 for vdpbf16ps and is taken only when asked for (model/dot_bf16.h says why).
#ifndef CPU_ISA_H
#define CPU_ISA_H

typedef enum {
    CPU_ISA_GENERIC,    // plain C, vectorized as -march allows
    CPU_ISA_AVX2,       // AVX2 + FMA (x86-64-v3)
    CPU_ISA_AVX512,     // AVX-512 F, BW, VL, DQ (x86-64-v4)
    CPU_ISA_AVX512BF16, // the above and AVX512_BF16 (vdpbf16ps)
    CPU_ISA_COUNT
} CpuIsa;

// The best set this CPU and OS support (CPU_ISA_GENERIC off x86-64).
CpuIsa cpu_isa_best(void);
// Whether the CPU can run isa's code.
int cpu_isa_supported(CpuIsa isa);
// The set the products use: PKV_CPU_ISA, else the default above. Decided once per process.
CpuIsa cpu_isa(void);
const char *cpu_isa_name(CpuIsa isa);
// The set named s ("avx2", ...), or -1.
int cpu_isa_parse(const char *s);

#endif
