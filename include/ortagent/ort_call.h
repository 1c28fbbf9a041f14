/*
 * ortagent/ort_call.h -- typed calls through the OrtApi table declared in ort_abi.h.
 *
 *   ORTAGENT_CALL(Run)(session, ...)          a slot no newer than ORTAGENT_API_FLOOR; using it
 *                                             for a newer slot is a compile-time error.
 *   ORTAGENT_CALL_NEWER(CopyTensors)(...)     a newer slot: when the loaded runtime's API version
 *                                             is older than the slot, a stand-in runs instead and
 *                                             returns an OrtStatus (ORT_NOT_IMPLEMENTED) naming
 *                                             the onnxruntime version the call needs.
 *   ORTAGENT_HAS(EpDevice_EpName)             whether the loaded runtime has the slot. A newer
 *                                             slot returning a plain value (or nothing) cannot
 *                                             report its own absence: check this first (its
 *                                             CALL_NEWER stand-in returns zero / does nothing).
 *   ORTAGENT_COMPILE_CALL(CompileModel)(...)  a slot of the OrtCompileApi table, with the same
 *                                             version check (the table comes from
 *                                             ortagent_compile_api(), NULL before 1.22).
 *
 * Each translation unit (each extension module, each C program) has its own `ortagent_rt`
 * pointer, set once to the process-wide runtime description owned by ortagent._runtime (or by
 * the C program itself).
 */
#ifndef ORTAGENT_ORT_CALL_H
#define ORTAGENT_ORT_CALL_H

#include <stdio.h>
#include "ortagent/ort_abi.h"

typedef void (*ortagent_any_fn)(void);

/* What is known about the loaded runtime. Filled in once by the loader. */
typedef struct ortagent_runtime {
    const ortagent_any_fn* api;   /* the OrtApi table; NULL until the runtime is loaded */
    uint32_t api_version;         /* the OrtApi version obtained (<= ORTAGENT_API_NEWEST) */
    const char* version_string;   /* the runtime's own version string */
    OrtEnv* env;                  /* the process-wide environment */
} ortagent_runtime;

static ortagent_runtime* ortagent_rt;

/* A slot that exists in every runtime ortagent accepts. The array size turns into a
 * compile-time error when `name` is newer than the floor. */
#define ORTAGENT_CALL(name)                                                                  \
    ((ortagent_fn_##name)ortagent_rt->api[ortagent_slot_##name +                             \
                                          0 * sizeof(char[ortagent_since_##name <=           \
                                                                  ORTAGENT_API_FLOOR ? 1 : -1])])

/* A slot newer than the floor: the runtime's function, or the stand-in below. */
#define ORTAGENT_CALL_NEWER(name)                                                            \
    (ortagent_rt->api_version >= (uint32_t)ortagent_since_##name                             \
         ? (ortagent_fn_##name)ortagent_rt->api[ortagent_slot_##name]                        \
         : ortagent_unavailable_##name)

static inline OrtStatus* ortagent_unavailable_status(const char* name, unsigned since) {
    char message[320];
    snprintf(message, sizeof message,
             "OrtApi::%s needs onnxruntime >= 1.%u (OrtApi version %u); the loaded runtime is "
             "%s (OrtApi version %u)",
             name, since, since, ortagent_rt->version_string ? ortagent_rt->version_string : "?",
             (unsigned)ortagent_rt->api_version);
    return ORTAGENT_CALL(CreateStatus)(ORT_NOT_IMPLEMENTED, message);
}

#define ORTAGENT_HAS(name) (ortagent_rt->api_version >= (uint32_t)ortagent_since_##name)

static inline OrtStatus* ortagent_compile_unavailable_status(const char* name, unsigned since) {
    char message[320];
    snprintf(message, sizeof message,
             "OrtCompileApi::%s needs onnxruntime >= 1.%u (OrtApi version %u); the loaded "
             "runtime is %s (OrtApi version %u)",
             name, since, since, ortagent_rt->version_string ? ortagent_rt->version_string : "?",
             (unsigned)ortagent_rt->api_version);
    return ORTAGENT_CALL(CreateStatus)(ORT_NOT_IMPLEMENTED, message);
}

#define ORTAGENT_DEFINE_UNAVAILABLE_(slot, since, ret, name, params)                         \
    static ret ortagent_unavailable_##name params {                                          \
        return ortagent_unavailable_status(#name, since);                                    \
    }
#define ORTAGENT_DEFINE_UNAVAILABLE_VALUE_(slot, since, ret, name, params)                   \
    static ret ortagent_unavailable_##name params { return (ret)0; }
#define ORTAGENT_DEFINE_UNAVAILABLE_VOID_(slot, since, ret, name, params)                    \
    static ret ortagent_unavailable_##name params {}
#define ORTAGENT_DEFINE_COMPILE_UNAVAILABLE_(slot, since, ret, name, params)                 \
    static ret ortagent_unavailable_##name params {                                          \
        return ortagent_compile_unavailable_status(#name, since);                            \
    }
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-function"
#endif
ORTAGENT_ORT_NEWER_FUNCTIONS(ORTAGENT_DEFINE_UNAVAILABLE_)
ORTAGENT_ORT_NEWER_VALUE_FUNCTIONS(ORTAGENT_DEFINE_UNAVAILABLE_VALUE_)
ORTAGENT_ORT_NEWER_VOID_FUNCTIONS(ORTAGENT_DEFINE_UNAVAILABLE_VOID_)
ORTAGENT_COMPILE_FUNCTIONS(ORTAGENT_DEFINE_COMPILE_UNAVAILABLE_)
ORTAGENT_COMPILE_VOID_FUNCTIONS(ORTAGENT_DEFINE_UNAVAILABLE_VOID_)
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#undef ORTAGENT_DEFINE_UNAVAILABLE_
#undef ORTAGENT_DEFINE_UNAVAILABLE_VALUE_
#undef ORTAGENT_DEFINE_UNAVAILABLE_VOID_
#undef ORTAGENT_DEFINE_COMPILE_UNAVAILABLE_

/* The OrtCompileApi table of the loaded runtime (this translation unit's copy, fetched once),
 * or NULL when the runtime is older than 1.22 or has none. */
static const ortagent_any_fn* ortagent_compile_table;

static inline const ortagent_any_fn* ortagent_compile_api(void) {
    if (ortagent_compile_table == NULL && ORTAGENT_HAS(GetCompileApi))
        ortagent_compile_table =
            (const ortagent_any_fn*)(const void*)ORTAGENT_CALL_NEWER(GetCompileApi)();
    return ortagent_compile_table;
}

/* A slot of the compile table: the runtime's function when the runtime has the slot's version
 * and a table, the stand-in otherwise. */
#define ORTAGENT_COMPILE_CALL(name)                                                          \
    (ORTAGENT_HAS(name) && ortagent_compile_api() != NULL                                    \
         ? (ortagent_fn_##name)ortagent_compile_api()[ortagent_slot_##name]                  \
         : ortagent_unavailable_##name)

#endif /* ORTAGENT_ORT_CALL_H */
