/*
 * Test-only helper for tests/test_output_memory.py, compiled by that test (never shipped):
 * take or release the pooled CPU allocator's lock from outside ortagent, as a thread inside
 * the pool's Alloc or Free holds it, so that the test can fork meanwhile.
 *
 * `allocator` is what pooled_cpu_allocator() (ortagent/_cpu_pool.pxi) returns: the address of the
 * process's ortagent_cpu_pool, whose first member is the OrtAllocator handed to onnxruntime.
 */
#include "ortagent/cpu_pool.h"

void ortagent_test_hold_pool_lock(void* allocator, int hold) {
    ortagent_cpu_pool* pool = (ortagent_cpu_pool*)allocator;
    if (hold)
        pthread_mutex_lock(&pool->lock);
    else
        pthread_mutex_unlock(&pool->lock);
}
