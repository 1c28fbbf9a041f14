/*
 * ortagent/fp_env.h -- subnormal floats flushed to zero on the calling thread for one run.
 *
 * onnxruntime's session entry "session.set_denormal_as_zero" sets the x86 MXCSR bits
 * flush-to-zero (FTZ, bit 15: a subnormal result becomes 0) and denormals-are-zero (DAZ,
 * bit 6: a subnormal operand reads as 0) on the threads of the session's pools, and on the
 * thread that creates the first session of the process only. A session with one intra-op
 * thread computes on the thread that calls Run, which then keeps its own bits: ortagent sets
 * them there for the run of a session created with that entry, and puts back what the
 * thread had after it. Some CPUs take a slow path for every subnormal operand or result
 * (onnxruntime's Softmax over masked attention scores there: 7x).
 *
 * Elsewhere than x86 these do nothing (onnxruntime sets the bits on x86 only).
 */
#ifndef ORTAGENT_FP_ENV_H
#define ORTAGENT_FP_ENV_H

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <xmmintrin.h>

#define ORTAGENT_MXCSR_FTZ_DAZ 0x8040u

/* Set FTZ and DAZ on this thread; returns the bits to give ortagent_flush_denormals_end. */
static inline unsigned int ortagent_flush_denormals_begin(void) {
    unsigned int csr = _mm_getcsr();
    if ((csr & ORTAGENT_MXCSR_FTZ_DAZ) != ORTAGENT_MXCSR_FTZ_DAZ)
        _mm_setcsr(csr | ORTAGENT_MXCSR_FTZ_DAZ);
    return csr & ORTAGENT_MXCSR_FTZ_DAZ;
}

/* Put back the thread's FTZ and DAZ bits as they were (the other bits, among them the
 * exception flags the run raised, are left as the run left them). */
static inline void ortagent_flush_denormals_end(unsigned int before) {
    unsigned int csr = _mm_getcsr();
    if ((csr & ORTAGENT_MXCSR_FTZ_DAZ) != before)
        _mm_setcsr((csr & ~ORTAGENT_MXCSR_FTZ_DAZ) | before);
}
#else
static inline unsigned int ortagent_flush_denormals_begin(void) { return 0; }
static inline void ortagent_flush_denormals_end(unsigned int before) { (void)before; }
#endif

#endif
