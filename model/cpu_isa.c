// Run-time choice of the products' instruction set (cpu_isa.h).
#include "cpu_isa.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

static const char *const names[CPU_ISA_COUNT] = {"generic", "avx2", "avx512", "avx512bf16"};

const char *cpu_isa_name(CpuIsa isa) { return (unsigned)isa < CPU_ISA_COUNT ? names[isa] : "?"; }

int cpu_isa_parse(const char *s) {
    for (int i = 0; i < CPU_ISA_COUNT; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

#if defined(__x86_64__)
static uint64_t xgetbv0(void) { // the OS-enabled register state (XCR0); needs OSXSAVE
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

static CpuIsa detect(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return CPU_ISA_GENERIC;
    int fma = c >> 12 & 1, osxsave = c >> 27 & 1, avx = c >> 28 & 1;
    if (!osxsave || !avx || !fma) return CPU_ISA_GENERIC;
    uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6) return CPU_ISA_GENERIC; // XMM and YMM state saved
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b >> 5 & 1)) return CPU_ISA_GENERIC; // AVX2
    // AVX-512 F (bit 16), DQ (17), BW (30), VL (31), and the opmask and ZMM state saved (XCR0 5-7)
    int avx512 = (b >> 16 & 1) && (b >> 17 & 1) && (b >> 30 & 1) && (b >> 31 & 1) && (xcr0 & 0xe0) == 0xe0;
    if (!avx512) return CPU_ISA_AVX2;
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1)) return CPU_ISA_AVX512BF16; // AVX512_BF16
    return CPU_ISA_AVX512;
}
static int detect_vnni(void) { // AVX512_VNNI: leaf 7, ECX bit 11
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c >> 11 & 1);
}
#else
static CpuIsa detect(void) { return CPU_ISA_GENERIC; }
static int detect_vnni(void) { return 0; }
#endif

static CpuIsa best = CPU_ISA_GENERIC, chosen = CPU_ISA_GENERIC;
static pthread_once_t best_once = PTHREAD_ONCE_INIT, chosen_once = PTHREAD_ONCE_INIT;

static void init_best(void) { best = detect(); }

CpuIsa cpu_isa_best(void) {
    pthread_once(&best_once, init_best);
    return best;
}

// The default, or PKV_CPU_ISA's choice; the line on stderr says which set runs whenever it was
// asked for or rounds the activations (the one numerical difference a user may not expect).
static void init_chosen(void) {
    CpuIsa b = cpu_isa_best();
    const char *env = getenv("PKV_CPU_ISA");
    chosen = b;
    if (!env || !*env) {
        if (b == CPU_ISA_AVX512BF16)
            fprintf(stderr, "cpu: bf16 weights' products on %s (this CPU's best): activations rounded to bf16; PKV_CPU_ISA=fp32 keeps them fp32\n", names[b]);
        return;
    }
    int want = strcmp(env, "fp32") == 0 ? (b < CPU_ISA_AVX512 ? (int)b : CPU_ISA_AVX512) : cpu_isa_parse(env);
    if (want < 0)
        fprintf(stderr, "warning: PKV_CPU_ISA=%s is none of generic, avx2, avx512, avx512bf16, fp32: using %s\n", env, names[b]);
    else if (want > (int)b)
        fprintf(stderr, "warning: PKV_CPU_ISA=%s: this CPU lacks it, using %s\n", env, names[b]);
    else
        chosen = (CpuIsa)want;
    fprintf(stderr, "cpu: products on %s (PKV_CPU_ISA=%s; this CPU's best: %s)%s\n", names[chosen], env, names[b],
            chosen == CPU_ISA_AVX512BF16 ? ": activations rounded to bf16" : "");
}

int cpu_isa_supported(CpuIsa isa) { return isa <= cpu_isa_best(); }

CpuIsa cpu_isa(void) {
    pthread_once(&chosen_once, init_chosen);
    return chosen;
}

static int vnni;
static pthread_once_t vnni_once = PTHREAD_ONCE_INIT;
static void init_vnni(void) { vnni = cpu_isa() >= CPU_ISA_AVX512 && detect_vnni(); }

int cpu_int8_vnni(void) {
    pthread_once(&vnni_once, init_vnni);
    return vnni;
}
