// The kernels for one instruction set (see linear.cpp and dispatch.cpp); x86-64 only, empty elsewhere.
#if defined(__x86_64__)
#define GYM_ISA_NS gym_isa_avx512_vnni
#define GYM_ISA_NAME "avx512_vnni"
#define GYM_ISA_AVX512_VNNI 1
#include "linear.cpp"
#endif
