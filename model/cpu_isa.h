// Which vector instructions the CPU path's products use, chosen at run time so one binary serves
// any x86-64: cpuid says what the processor has, xgetbv whether the kernel saves those registers.
// The kernels for every set are always built (per-function target attributes); a CPU that lacks
// a set never calls its functions.
//
// The default is the best set the CPU has, avx512bf16 included: on bf16 weights that set rounds
// the activations to bf16 (vdpbf16ps for decode, oneDNN's bf16 matmul for a prompt: on AMX several
// times faster than widening the weights for sgemm; llama.cpp rounds them the same way there), and
// says so on stderr at its first product. generic, avx2 and avx512 multiply the fp32 activations
// as they are. PKV_CPU_ISA=generic|avx2|avx512|avx512bf16 picks a set, fp32 the best of the first
// three this CPU has (tests force each path so, and the suite runs on fp32); a set the CPU lacks
// falls back to the best it has, with a warning.
#ifndef CPU_ISA_H
#define CPU_ISA_H

typedef enum {
    CPU_ISA_GENERIC,    // plain C, vectorized as -march allows
    CPU_ISA_AVX2,       // AVX2 + FMA (x86-64-v3)
    CPU_ISA_AVX512,     // AVX-512 F, BW, VL, DQ (x86-64-v4)
    CPU_ISA_AVX512BF16, // the above and AVX512_BF16 (vdpbf16ps): activations rounded to bf16
    CPU_ISA_COUNT
} CpuIsa;

// The best set this CPU and OS support (CPU_ISA_GENERIC off x86-64). Reads no environment, so a
// test may call it before it sets PKV_CPU_ISA for cpu_isa().
CpuIsa cpu_isa_best(void);
// Whether the CPU can run isa's code.
int cpu_isa_supported(CpuIsa isa);
// The set the products use: PKV_CPU_ISA, else cpu_isa_best(). Decided once per process, at its
// first call.
CpuIsa cpu_isa(void);
const char *cpu_isa_name(CpuIsa isa);
// The set named s ("avx2", ...), or -1 (also for "fp32", which names no one set).
int cpu_isa_parse(const char *s);
// Whether the quantized weights' decode products use AVX512_VNNI (quant_vnni.c): the CPU has it
// and the chosen set is avx512 or avx512bf16. Integer sums: the same results as avx2's.
int cpu_int8_vnni(void);

#endif
