/*
 * ortagent/cpu_pool.h -- a CPU allocator that keeps freed blocks for reuse, handed to
 * onnxruntime as an OrtAllocator (see ortagent_allocator_v1 in ort_abi.h).
 *
 * Why: a tensor onnxruntime makes with its default CPU allocator costs a posix_memalign and a
 * free (about 700 instructions of the ~2,200 an output's life costs). A training step
 * preallocates each gradient the same size every step, so a block freed by one step is the
 * block the next step asks for: this pool hands it back without calling malloc.
 *
 * Blocks are 64-byte aligned (what onnxruntime's CPU allocator gives; MLAS kernels rely on
 * it for speed, not for correctness). Each block carries a 64-byte header before the
 * address handed out, holding its size class, so Free(p) needs no lookup:
 *
 *   [header: size class][payload: 64 << class bytes]     class 0..ORTAGENT_POOL_CLASSES-1
 *   [header: ORTAGENT_POOL_UNPOOLED][payload: any size]  larger requests, malloc'd and freed
 *
 * Each class keeps at most ORTAGENT_POOL_KEEP_BYTES of free blocks (and at least one block),
 * so the pool never holds more than about 2 MiB that nobody uses. A mutex guards the free
 * lists: onnxruntime frees a tensor on whichever thread drops its last reference, with or
 * without the GIL. The pool lives as long as the process (tensors keep a pointer to it).
 */
#ifndef ORTAGENT_CPU_POOL_H
#define ORTAGENT_CPU_POOL_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ortagent/ort_abi.h"

#define ORTAGENT_POOL_ALIGN 64
#define ORTAGENT_POOL_CLASSES 11                 /* payloads of 64 B .. 64 KiB */
#define ORTAGENT_POOL_KEEP_BYTES (128 * 1024)    /* free bytes kept per class */
#define ORTAGENT_POOL_UNPOOLED (-1)

typedef struct ortagent_pool_block {
    struct ortagent_pool_block* next;            /* in the header, while on a free list */
    int size_class;
} ortagent_pool_block;

typedef struct ortagent_cpu_pool {
    ortagent_allocator_v1 base;                  /* what onnxruntime calls; the first member */
    const OrtMemoryInfo* info;                   /* CPU, device allocator, default memory */
    pthread_mutex_t lock;
    ortagent_pool_block* free_blocks[ORTAGENT_POOL_CLASSES];
    size_t n_free[ORTAGENT_POOL_CLASSES];
    /* counters, read by tests (under the lock) */
    size_t n_live;                               /* blocks handed out and not yet freed */
    size_t n_reused;                             /* allocations served from a free list */
    size_t n_fresh;                              /* allocations that called the C allocator */
} ortagent_cpu_pool;

static size_t ortagent_pool_keep(int size_class) {
    size_t blocks = ORTAGENT_POOL_KEEP_BYTES / ((size_t)ORTAGENT_POOL_ALIGN << size_class);
    return blocks > 0 ? blocks : 1;
}

static int ortagent_pool_class_of(size_t size) {
    int size_class = 0;
    while (size_class < ORTAGENT_POOL_CLASSES && ((size_t)ORTAGENT_POOL_ALIGN << size_class) < size)
        size_class++;
    return size_class < ORTAGENT_POOL_CLASSES ? size_class : ORTAGENT_POOL_UNPOOLED;
}

static void* ortagent_pool_alloc(ortagent_allocator_v1* self, size_t size) {
    ortagent_cpu_pool* pool = (ortagent_cpu_pool*)self;
    int size_class = ortagent_pool_class_of(size);
    ortagent_pool_block* block = NULL;
    void* raw = NULL;
    pthread_mutex_lock(&pool->lock);
    if (size_class != ORTAGENT_POOL_UNPOOLED && pool->free_blocks[size_class] != NULL) {
        block = pool->free_blocks[size_class];
        pool->free_blocks[size_class] = block->next;
        pool->n_free[size_class]--;
        pool->n_reused++;
    } else {
        pool->n_fresh++;
    }
    pool->n_live++;
    pthread_mutex_unlock(&pool->lock);
    if (block == NULL) {
        size_t payload = size_class == ORTAGENT_POOL_UNPOOLED ? size : (size_t)ORTAGENT_POOL_ALIGN << size_class;
        if (payload > SIZE_MAX - ORTAGENT_POOL_ALIGN ||
            posix_memalign(&raw, ORTAGENT_POOL_ALIGN, ORTAGENT_POOL_ALIGN + payload) != 0) {
            pthread_mutex_lock(&pool->lock);
            pool->n_live--;
            pool->n_fresh--;
            pthread_mutex_unlock(&pool->lock);
            return NULL;                         /* onnxruntime reports the failed allocation */
        }
        block = (ortagent_pool_block*)raw;
        block->size_class = size_class;
    }
    block->next = NULL;
    return (char*)block + ORTAGENT_POOL_ALIGN;
}

static void ortagent_pool_free(ortagent_allocator_v1* self, void* p) {
    ortagent_cpu_pool* pool = (ortagent_cpu_pool*)self;
    ortagent_pool_block* block;
    int size_class;
    if (p == NULL)
        return;
    block = (ortagent_pool_block*)((char*)p - ORTAGENT_POOL_ALIGN);
    size_class = block->size_class;
    pthread_mutex_lock(&pool->lock);
    pool->n_live--;
    if (size_class != ORTAGENT_POOL_UNPOOLED && pool->n_free[size_class] < ortagent_pool_keep(size_class)) {
        block->next = pool->free_blocks[size_class];
        pool->free_blocks[size_class] = block;
        pool->n_free[size_class]++;
        block = NULL;
    }
    pthread_mutex_unlock(&pool->lock);
    free(block);                                 /* NULL when kept */
}

static const OrtMemoryInfo* ortagent_pool_info(const ortagent_allocator_v1* self) {
    return ((const ortagent_cpu_pool*)self)->info;
}

/* The counters and the number of free blocks kept, read under the lock. */
static void ortagent_pool_counts(ortagent_cpu_pool* pool, size_t* live, size_t* reused, size_t* fresh,
                                 size_t* kept) {
    int size_class;
    pthread_mutex_lock(&pool->lock);
    *live = pool->n_live;
    *reused = pool->n_reused;
    *fresh = pool->n_fresh;
    *kept = 0;
    for (size_class = 0; size_class < ORTAGENT_POOL_CLASSES; size_class++)
        *kept += pool->n_free[size_class];
    pthread_mutex_unlock(&pool->lock);
}

/* The pool of this translation unit, for the fork handler. */
static ortagent_cpu_pool* ortagent_pool_of_process;

/* In a forked child only the forking thread exists: a lock another thread held at the fork
 * would never be released, so the child starts with a fresh one (the free lists are only ever
 * changed under the lock, a few statements at a time). */
static void ortagent_pool_after_fork_child(void) {
    if (ortagent_pool_of_process != NULL)
        pthread_mutex_init(&ortagent_pool_of_process->lock, NULL);
}

/* Fill in `pool` (zeroed storage) around `info`, which must outlive it; once per process.
 * Returns 0 or an errno. */
static int ortagent_pool_init(ortagent_cpu_pool* pool, const OrtMemoryInfo* info) {
    int error;
    memset(pool, 0, sizeof(*pool));
    pool->base.version = 1;                      /* onnxruntime reads no member added later */
    pool->base.Alloc = ortagent_pool_alloc;
    pool->base.Free = ortagent_pool_free;
    pool->base.Info = ortagent_pool_info;
    pool->info = info;
    error = pthread_mutex_init(&pool->lock, NULL);
    if (error != 0)
        return error;
    ortagent_pool_of_process = pool;
    return pthread_atfork(NULL, NULL, ortagent_pool_after_fork_child);
}

#endif
