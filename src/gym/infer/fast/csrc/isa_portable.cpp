// The kernels for one instruction set (see linear.cpp and dispatch.cpp).
#define GYM_ISA_NS gym_isa_portable
#define GYM_ISA_NAME "portable"
#include "linear.cpp"
