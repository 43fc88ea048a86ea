/* avx512bf16.c: the avx512bf16 kernel table, for CPUs with AVX512_BF16 as
 * well (compiled with the avx512 flags plus -mavx512bf16; dispatch.c checks
 * cpuid before anything here runs). It is avx512.c compiled again with
 * Q35_KERNELS_BF16: every kernel is avx512's except the matmul of BF16
 * weights, which rounds x to bf16 and uses vdpbf16ps (kernels.h states its
 * accuracy). */
#define Q35_KERNELS_BF16 1
#include "avx512.c"
