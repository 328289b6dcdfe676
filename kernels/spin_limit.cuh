// A wait that can never end (a lost peer GPU, a deadlocked barrier) becomes a launch error, not a
// hang: after ~2^26 polls (about a minute) the waiting thread stores to address 0. Not __trap():
// with a trap in a kernel ptxas keeps the whole kernel within its entry register budget and
// ignores setmaxnreg.inc (the prefill kernels), so every spin loop uses this one store instead.
#ifndef SPIN_LIMIT_CUH
#define SPIN_LIMIT_CUH

__device__ __forceinline__ void spin_limit(long *spins) {
    if (++*spins > (1L << 26)) asm volatile("st.global.u32 [%0], 1;" ::"l"(0ull) : "memory");
}

#endif
