// The kernels for one instruction set (see linear.cpp and dispatch.cpp); x86-64 only, empty elsewhere.
#if defined(__x86_64__)
#define GYM_ISA_NS gym_isa_avx2
#define GYM_ISA_NAME "avx2"
#define GYM_ISA_AVX2 1
#include "linear.cpp"
#endif
