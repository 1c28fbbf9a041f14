/*
 * ort_floor -- the benchmark floor: what one inference costs when the onnxruntime C API is
 * called straight from C. ortagent's Python-side benchmarks are read against these numbers.
 *
 * Like the ortagent extension, it links no onnxruntime library: the library given by --lib
 * (or $ORTAGENT_ORT_LIBRARY) is dlopen-ed, its OrtGetApiBase looked up, the API version
 * negotiated (GetApi(min(N, ORTAGENT_API_NEWEST)) for a runtime "1.N.P"), and every call goes
 * through ortagent's own declarations (include/ortagent/ort_call.h).
 *
 * It creates one CPU session (by default: 1 intra-op and 1 inter-op thread, sequential
 * execution, all graph optimisations), feeds float32 tensors of the model's input shapes
 * (symbolic dimensions set to --dim), created once, and times each mode in a loop:
 *
 *   run               Run with the reused input values; outputs allocated by ORT and
 *                     released every iteration (what a plain session.run does)
 *   run-read          Run, then read each output's type, shape and data address (what any
 *                     caller that uses the outputs does), and release them
 *   run-prealloc      Run into output values allocated once
 *   binding           RunWithBinding: inputs bound once, outputs bound to the CPU device
 *                     (ORT allocates them in the first run and reuses them afterwards)
 *   binding-prealloc  RunWithBinding with outputs bound to values allocated once
 *   is-tensor         one trivial C API call (IsTensor on an input): the cost of a call into
 *                     the library
 *   noop              the timing loop around an empty function: the harness itself
 *
 * Output: one JSON line per mode on stdout,
 *   {"mode": ..., "model": ..., "iterations": N, "repeat": R, "ns_per_call": median,
 *    "min_ns_per_call": ..., "samples": [ns per call of each repetition], ...}
 * Each sample times N consecutive calls; N is --iterations, or chosen so that one sample
 * lasts about --seconds. Diagnostics go to stderr; any failed ORT call prints its message and
 * exits with status 1 (2 for usage errors).
 *
 * --serve keeps the session for a driver that interleaves the floor with other contenders
 * (python -m benchmarks.bench): after set-up it prints one line {"ready": true, ...} and then answers
 * commands read from stdin, one per line, until "quit" or end of input:
 *   MODE N    time N consecutive calls of MODE; answers
 *             {"mode": ..., "iterations": N, "ns": T, "cpu_ns": C} where T is the elapsed time
 *             of the N calls (the same loop as the sampled modes) and C the CPU time this
 *             thread spent in them
 * A malformed command is answered {"error": ...}; the process keeps serving.
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ortagent/ort_call.h"

#define MAX_CONFIG 32

/* ---- errors ------------------------------------------------------------------------------ */

static void die(int status, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("ort_floor: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(status);
}

static const char* error_code_name(OrtErrorCode code) {
#define ERROR_NAME(name, value) if (code == name) return #name;
    ORTAGENT_ENUM_OrtErrorCode(ERROR_NAME)
#undef ERROR_NAME
    return "unknown error code";
}

static void check_status(OrtStatus* status, const char* what) {
    if (status == NULL) return;
    OrtErrorCode code = ORTAGENT_CALL(GetErrorCode)(status);
    fprintf(stderr, "ort_floor: %s failed: %s: %s\n", what, error_code_name(code),
            ORTAGENT_CALL(GetErrorMessage)(status));
    ORTAGENT_CALL(ReleaseStatus)(status);
    exit(1);
}
#define CHECK(call) check_status((call), #call)

static void* xcalloc(size_t count, size_t size) {
    void* p = calloc(count ? count : 1, size ? size : 1);
    if (p == NULL) die(1, "out of memory");
    return p;
}

/* ---- options ----------------------------------------------------------------------------- */

typedef struct options {
    const char* model;
    const char* library;
    int intra_threads;
    int inter_threads;
    int parallel;
    GraphOptimizationLevel opt_level;
    const char* opt_level_name;
    const char* config_keys[MAX_CONFIG];
    const char* config_values[MAX_CONFIG];
    size_t config_count;
    const char* modes;
    long iterations;
    double seconds;
    int repeat;
    long warmup;
    long symbolic_dim;
    int serve;
} options;

static void usage(FILE* out) {
    fputs("usage: ort_floor MODEL.onnx [--lib PATH] [--threads N] [--inter-threads N]\n"
          "         [--parallel] [--opt-level disable|basic|extended|all]\n"
          "         [--config KEY=VALUE]... [--modes LIST] [--iterations N] [--seconds S]\n"
          "         [--repeat R] [--warmup N] [--dim N] [--serve]\n"
          "  --lib PATH        libonnxruntime.so to dlopen (default: $ORTAGENT_ORT_LIBRARY)\n"
          "  --threads N       intra-op threads (default 1)\n"
          "  --inter-threads N inter-op threads (default 1)\n"
          "  --parallel        ORT_PARALLEL execution mode (default sequential)\n"
          "  --opt-level L     graph optimisation level (default all)\n"
          "  --config K=V      session config entry (repeatable)\n"
          "  --modes LIST      comma-separated, from: run, run-read, run-prealloc, binding,\n"
          "                    binding-prealloc, is-tensor, noop (default: all)\n"
          "  --iterations N    calls per sample (default: chosen from --seconds)\n"
          "  --seconds S       target duration of one sample (default 0.2)\n"
          "  --repeat R        samples per mode (default 5)\n"
          "  --warmup N        untimed calls before the samples (default 20)\n"
          "  --dim N           value of symbolic input dimensions (default 1)\n"
          "  --serve           answer \"MODE N\" commands on stdin (see the source)\n",
          out);
}

static long parse_long(const char* flag, const char* text, long min) {
    char* end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno || *end || end == text || value < min)
        die(2, "%s needs an integer >= %ld, got '%s'", flag, min, text);
    return value;
}

static void parse_options(int argc, char** argv, options* o) {
    memset(o, 0, sizeof *o);
    o->library = getenv("ORTAGENT_ORT_LIBRARY");
    o->intra_threads = 1;
    o->inter_threads = 1;
    o->opt_level = ORT_ENABLE_ALL;
    o->opt_level_name = "all";
    o->modes = "run,run-read,run-prealloc,binding,binding-prealloc,is-tensor,noop";
    o->seconds = 0.2;
    o->repeat = 5;
    o->warmup = 20;
    o->symbolic_dim = 1;
    for (int i = 1; i < argc; ++i) {
        const char* arg = argv[i];
        const char* value = NULL;
        char flag[64];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            usage(stdout);
            exit(0);
        }
        if (strncmp(arg, "--", 2) != 0) {
            if (o->model) die(2, "more than one model given ('%s', '%s')", o->model, arg);
            o->model = arg;
            continue;
        }
        const char* eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (len >= sizeof flag) die(2, "unknown option '%s'", arg);
        memcpy(flag, arg, len);
        flag[len] = '\0';
        if (strcmp(flag, "--parallel") == 0) {
            if (eq) die(2, "--parallel takes no value");
            o->parallel = 1;
            continue;
        }
        if (strcmp(flag, "--serve") == 0) {
            if (eq) die(2, "--serve takes no value");
            o->serve = 1;
            continue;
        }
        if (eq) {
            value = eq + 1;
        } else {
            if (i + 1 >= argc) die(2, "%s needs a value", flag);
            value = argv[++i];
        }
        if (strcmp(flag, "--lib") == 0) {
            o->library = value;
        } else if (strcmp(flag, "--threads") == 0) {
            o->intra_threads = (int)parse_long(flag, value, 0);
        } else if (strcmp(flag, "--inter-threads") == 0) {
            o->inter_threads = (int)parse_long(flag, value, 0);
        } else if (strcmp(flag, "--opt-level") == 0) {
            o->opt_level_name = value;
            if (strcmp(value, "disable") == 0) o->opt_level = ORT_DISABLE_ALL;
            else if (strcmp(value, "basic") == 0) o->opt_level = ORT_ENABLE_BASIC;
            else if (strcmp(value, "extended") == 0) o->opt_level = ORT_ENABLE_EXTENDED;
            else if (strcmp(value, "all") == 0) o->opt_level = ORT_ENABLE_ALL;
            else die(2, "--opt-level is one of disable, basic, extended, all; got '%s'", value);
        } else if (strcmp(flag, "--config") == 0) {
            const char* sep = strchr(value, '=');
            if (!sep || sep == value) die(2, "--config needs KEY=VALUE, got '%s'", value);
            if (o->config_count == MAX_CONFIG) die(2, "at most %d --config entries", MAX_CONFIG);
            char* key = xcalloc((size_t)(sep - value) + 1, 1);
            memcpy(key, value, (size_t)(sep - value));
            o->config_keys[o->config_count] = key;
            o->config_values[o->config_count++] = sep + 1;
        } else if (strcmp(flag, "--modes") == 0) {
            o->modes = value;
        } else if (strcmp(flag, "--iterations") == 0) {
            o->iterations = parse_long(flag, value, 1);
        } else if (strcmp(flag, "--seconds") == 0) {
            char* end;
            o->seconds = strtod(value, &end);
            if (*end || end == value || !(o->seconds > 0))
                die(2, "--seconds needs a positive number, got '%s'", value);
        } else if (strcmp(flag, "--repeat") == 0) {
            o->repeat = (int)parse_long(flag, value, 1);
        } else if (strcmp(flag, "--warmup") == 0) {
            o->warmup = parse_long(flag, value, 0);
        } else if (strcmp(flag, "--dim") == 0) {
            o->symbolic_dim = parse_long(flag, value, 0);
        } else {
            die(2, "unknown option '%s' (see --help)", flag);
        }
    }
    if (!o->model) {
        usage(stderr);
        die(2, "no model given");
    }
    if (!o->library || !*o->library)
        die(2, "no onnxruntime library: pass --lib PATH or set ORTAGENT_ORT_LIBRARY");
}

/* ---- loading the runtime ----------------------------------------------------------------- */

static ortagent_runtime runtime;

static void load_runtime(const char* path) {
    void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) die(1, "cannot load %s: %s", path, dlerror());
    void* symbol = dlsym(handle, ORTAGENT_GET_API_BASE_SYMBOL);
    if (symbol == NULL)
        die(1, "%s exports no %s: %s", path, ORTAGENT_GET_API_BASE_SYMBOL, dlerror());
    const ortagent_api_base* base = ((ortagent_get_api_base_fn)symbol)();
    if (base == NULL) die(1, "%s() returned NULL", ORTAGENT_GET_API_BASE_SYMBOL);
    const char* version = base->get_version_string();
    unsigned major = 0, minor = 0;
    if (version == NULL || sscanf(version, "%u.%u", &major, &minor) != 2 || major != 1)
        die(1, "%s reports version '%s', not 1.N.P", path, version ? version : "(null)");
    if (minor < ORTAGENT_API_FLOOR)
        die(1, "%s is onnxruntime %s; ortagent needs 1.%d or newer", path, version,
            ORTAGENT_API_FLOOR);
    /* Ask once for the version both sides know: asking a runtime for a newer API than it
     * has makes it print an error, so no probing downwards. */
    uint32_t api_version = minor < ORTAGENT_API_NEWEST ? minor : ORTAGENT_API_NEWEST;
    const void* api = base->get_api(api_version);
    if (api == NULL)
        die(1, "onnxruntime %s has no OrtApi version %u", version, (unsigned)api_version);
    runtime.api = (const ortagent_any_fn*)api;
    runtime.api_version = api_version;
    runtime.version_string = version;
    ortagent_rt = &runtime;
}

/* ---- the benchmark state ----------------------------------------------------------------- */

typedef struct bench {
    OrtSession* session;
    OrtAllocator* allocator;
    OrtMemoryInfo* cpu;
    size_t input_count, output_count;
    char** input_names;
    char** output_names;
    OrtValue** inputs;
    void** input_buffers;
    OrtValue** outputs;          /* filled by Run in the "run" mode */
    OrtValue** preallocated;     /* outputs allocated once */
    OrtIoBinding* binding;       /* outputs bound to the CPU device */
    OrtIoBinding* binding_pre;   /* outputs bound to `preallocated` */
} bench;

static void create_inputs(bench* b, long symbolic_dim) {
    b->inputs = xcalloc(b->input_count, sizeof(OrtValue*));
    b->input_buffers = xcalloc(b->input_count, sizeof(void*));
    for (size_t i = 0; i < b->input_count; ++i) {
        OrtTypeInfo* type_info;
        const OrtTensorTypeAndShapeInfo* tensor_info;
        ONNXType onnx_type;
        ONNXTensorElementDataType element_type;
        size_t ndim;
        CHECK(ORTAGENT_CALL(SessionGetInputTypeInfo)(b->session, i, &type_info));
        CHECK(ORTAGENT_CALL(GetOnnxTypeFromTypeInfo)(type_info, &onnx_type));
        if (onnx_type != ONNX_TYPE_TENSOR)
            die(1, "input '%s' is not a tensor; ort_floor feeds tensors only", b->input_names[i]);
        CHECK(ORTAGENT_CALL(CastTypeInfoToTensorInfo)(type_info, &tensor_info));
        CHECK(ORTAGENT_CALL(GetTensorElementType)(tensor_info, &element_type));
        if (element_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)
            die(1, "input '%s' has element type %d; ort_floor feeds float32 only",
                b->input_names[i], (int)element_type);
        CHECK(ORTAGENT_CALL(GetDimensionsCount)(tensor_info, &ndim));
        int64_t* dims = xcalloc(ndim, sizeof(int64_t));
        CHECK(ORTAGENT_CALL(GetDimensions)(tensor_info, dims, ndim));
        size_t count = 1;
        for (size_t d = 0; d < ndim; ++d) {
            if (dims[d] < 0) dims[d] = symbolic_dim;
            count *= (size_t)dims[d];
        }
        ORTAGENT_CALL(ReleaseTypeInfo)(type_info);

        float* data = xcalloc(count, sizeof(float));
        for (size_t k = 0; k < count; ++k) data[k] = (float)((int)(k % 23) - 11) * 0.0625f;
        b->input_buffers[i] = data;
        CHECK(ORTAGENT_CALL(CreateTensorWithDataAsOrtValue)(
            b->cpu, data, count * sizeof(float), dims, ndim, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
            &b->inputs[i]));
        free(dims);
    }
}

/* One Run to learn the outputs' types and shapes, then values of those allocated once. */
static void create_preallocated_outputs(bench* b) {
    OrtValue** first = xcalloc(b->output_count, sizeof(OrtValue*));
    CHECK(ORTAGENT_CALL(Run)(b->session, NULL, (const char* const*)b->input_names,
                             (const OrtValue* const*)b->inputs, b->input_count,
                             (const char* const*)b->output_names, b->output_count, first));
    b->preallocated = xcalloc(b->output_count, sizeof(OrtValue*));
    for (size_t k = 0; k < b->output_count; ++k) {
        OrtTensorTypeAndShapeInfo* info;
        ONNXTensorElementDataType element_type;
        size_t ndim;
        CHECK(ORTAGENT_CALL(GetTensorTypeAndShape)(first[k], &info));
        CHECK(ORTAGENT_CALL(GetTensorElementType)(info, &element_type));
        CHECK(ORTAGENT_CALL(GetDimensionsCount)(info, &ndim));
        int64_t* dims = xcalloc(ndim, sizeof(int64_t));
        CHECK(ORTAGENT_CALL(GetDimensions)(info, dims, ndim));
        CHECK(ORTAGENT_CALL(CreateTensorAsOrtValue)(b->allocator, dims, ndim, element_type,
                                                    &b->preallocated[k]));
        free(dims);
        ORTAGENT_CALL(ReleaseTensorTypeAndShapeInfo)(info);
        ORTAGENT_CALL(ReleaseValue)(first[k]);
    }
    free(first);
}

static void create_bindings(bench* b) {
    CHECK(ORTAGENT_CALL(CreateIoBinding)(b->session, &b->binding));
    CHECK(ORTAGENT_CALL(CreateIoBinding)(b->session, &b->binding_pre));
    for (size_t i = 0; i < b->input_count; ++i) {
        CHECK(ORTAGENT_CALL(BindInput)(b->binding, b->input_names[i], b->inputs[i]));
        CHECK(ORTAGENT_CALL(BindInput)(b->binding_pre, b->input_names[i], b->inputs[i]));
    }
    for (size_t k = 0; k < b->output_count; ++k) {
        CHECK(ORTAGENT_CALL(BindOutputToDevice)(b->binding, b->output_names[k], b->cpu));
        CHECK(ORTAGENT_CALL(BindOutput)(b->binding_pre, b->output_names[k], b->preallocated[k]));
    }
}

static void setup(bench* b, const options* o) {
    OrtEnv* env;
    OrtSessionOptions* so;
    CHECK(ORTAGENT_CALL(CreateEnv)(ORT_LOGGING_LEVEL_WARNING, "ort_floor", &env));
    runtime.env = env;
    CHECK(ORTAGENT_CALL(CreateSessionOptions)(&so));
    CHECK(ORTAGENT_CALL(SetIntraOpNumThreads)(so, o->intra_threads));
    CHECK(ORTAGENT_CALL(SetInterOpNumThreads)(so, o->inter_threads));
    CHECK(ORTAGENT_CALL(SetSessionExecutionMode)(so, o->parallel ? ORT_PARALLEL : ORT_SEQUENTIAL));
    CHECK(ORTAGENT_CALL(SetSessionGraphOptimizationLevel)(so, o->opt_level));
    for (size_t c = 0; c < o->config_count; ++c)
        CHECK(ORTAGENT_CALL(AddSessionConfigEntry)(so, o->config_keys[c], o->config_values[c]));
    CHECK(ORTAGENT_CALL(CreateSession)(env, o->model, so, &b->session));
    ORTAGENT_CALL(ReleaseSessionOptions)(so);

    CHECK(ORTAGENT_CALL(GetAllocatorWithDefaultOptions)(&b->allocator));
    CHECK(ORTAGENT_CALL(CreateCpuMemoryInfo)(OrtArenaAllocator, OrtMemTypeDefault, &b->cpu));
    CHECK(ORTAGENT_CALL(SessionGetInputCount)(b->session, &b->input_count));
    CHECK(ORTAGENT_CALL(SessionGetOutputCount)(b->session, &b->output_count));
    if (b->output_count == 0) die(1, "%s has no outputs", o->model);
    b->input_names = xcalloc(b->input_count, sizeof(char*));
    b->output_names = xcalloc(b->output_count, sizeof(char*));
    for (size_t i = 0; i < b->input_count; ++i)
        CHECK(ORTAGENT_CALL(SessionGetInputName)(b->session, i, b->allocator, &b->input_names[i]));
    for (size_t k = 0; k < b->output_count; ++k)
        CHECK(ORTAGENT_CALL(SessionGetOutputName)(b->session, k, b->allocator,
                                                  &b->output_names[k]));
    b->outputs = xcalloc(b->output_count, sizeof(OrtValue*));
    create_inputs(b, o->symbolic_dim);
    create_preallocated_outputs(b);
    create_bindings(b);
}

static void teardown(bench* b) {
    ORTAGENT_CALL(ReleaseIoBinding)(b->binding);
    ORTAGENT_CALL(ReleaseIoBinding)(b->binding_pre);
    for (size_t k = 0; k < b->output_count; ++k) {
        ORTAGENT_CALL(ReleaseValue)(b->preallocated[k]);
        CHECK(ORTAGENT_CALL(AllocatorFree)(b->allocator, b->output_names[k]));
    }
    for (size_t i = 0; i < b->input_count; ++i) {
        ORTAGENT_CALL(ReleaseValue)(b->inputs[i]);
        free(b->input_buffers[i]);
        CHECK(ORTAGENT_CALL(AllocatorFree)(b->allocator, b->input_names[i]));
    }
    ORTAGENT_CALL(ReleaseMemoryInfo)(b->cpu);
    ORTAGENT_CALL(ReleaseSession)(b->session);
    ORTAGENT_CALL(ReleaseEnv)(runtime.env);
    free(b->inputs);
    free(b->input_buffers);
    free(b->outputs);
    free(b->preallocated);
    free(b->input_names);
    free(b->output_names);
}

/* ---- the timed steps ---------------------------------------------------------------------- */

typedef void (*step_fn)(bench*);

__attribute__((noinline)) static void step_run(bench* b) {
    for (size_t k = 0; k < b->output_count; ++k) b->outputs[k] = NULL;
    CHECK(ORTAGENT_CALL(Run)(b->session, NULL, (const char* const*)b->input_names,
                             (const OrtValue* const*)b->inputs, b->input_count,
                             (const char* const*)b->output_names, b->output_count, b->outputs));
    for (size_t k = 0; k < b->output_count; ++k) ORTAGENT_CALL(ReleaseValue)(b->outputs[k]);
}

/* Run, then read what a caller needs to use each output (element type, shape, data address),
 * as any binding that hands outputs to its caller must: in one call on onnxruntime >= 1.24
 * (GetTensorElementTypeAndShapeDataReference), through an OrtTensorTypeAndShapeInfo before. */
__attribute__((noinline)) static void step_run_read(bench* b) {
    for (size_t k = 0; k < b->output_count; ++k) b->outputs[k] = NULL;
    CHECK(ORTAGENT_CALL(Run)(b->session, NULL, (const char* const*)b->input_names,
                             (const OrtValue* const*)b->inputs, b->input_count,
                             (const char* const*)b->output_names, b->output_count, b->outputs));
    for (size_t k = 0; k < b->output_count; ++k) {
        ONNXTensorElementDataType type;
        size_t rank = 0;
        int64_t dims[16];
        const int64_t* shape = NULL;
        void* data = NULL;
        if (ortagent_rt->api_version >= ortagent_since_GetTensorElementTypeAndShapeDataReference) {
            CHECK(ORTAGENT_CALL_NEWER(GetTensorElementTypeAndShapeDataReference)(
                b->outputs[k], &type, &shape, &rank));
            if (rank > 0) memcpy(dims, shape, (rank < 16 ? rank : 16) * sizeof(int64_t));
        } else {
            OrtTensorTypeAndShapeInfo* info = NULL;
            CHECK(ORTAGENT_CALL(GetTensorTypeAndShape)(b->outputs[k], &info));
            CHECK(ORTAGENT_CALL(GetTensorElementType)(info, &type));
            CHECK(ORTAGENT_CALL(GetDimensionsCount)(info, &rank));
            CHECK(ORTAGENT_CALL(GetDimensions)(info, dims, rank < 16 ? rank : 16));
            ORTAGENT_CALL(ReleaseTensorTypeAndShapeInfo)(info);
        }
        __asm__ volatile("" : : "r"(dims) : "memory");
        CHECK(ORTAGENT_CALL(GetTensorMutableData)(b->outputs[k], &data));
        __asm__ volatile("" : : "r"(data), "r"(type) : "memory");
        ORTAGENT_CALL(ReleaseValue)(b->outputs[k]);
    }
}

__attribute__((noinline)) static void step_run_prealloc(bench* b) {
    CHECK(ORTAGENT_CALL(Run)(b->session, NULL, (const char* const*)b->input_names,
                             (const OrtValue* const*)b->inputs, b->input_count,
                             (const char* const*)b->output_names, b->output_count,
                             b->preallocated));
}

__attribute__((noinline)) static void step_binding(bench* b) {
    CHECK(ORTAGENT_CALL(RunWithBinding)(b->session, NULL, b->binding));
}

__attribute__((noinline)) static void step_binding_prealloc(bench* b) {
    CHECK(ORTAGENT_CALL(RunWithBinding)(b->session, NULL, b->binding_pre));
}

__attribute__((noinline)) static void step_is_tensor(bench* b) {
    int is_tensor = 0;
    CHECK(ORTAGENT_CALL(IsTensor)(b->input_count ? b->inputs[0] : b->preallocated[0],
                                  &is_tensor));
    if (!is_tensor) die(1, "IsTensor said no");
}

__attribute__((noinline)) static void step_noop(bench* b) {
    __asm__ volatile("" : : "r"(b) : "memory");
}

static const struct {
    const char* name;
    step_fn step;
} MODES[] = {
    {"run", step_run},
    {"run-read", step_run_read},
    {"run-prealloc", step_run_prealloc},
    {"binding", step_binding},
    {"binding-prealloc", step_binding_prealloc},
    {"is-tensor", step_is_tensor},
    {"noop", step_noop},
};
#define MODE_COUNT (sizeof MODES / sizeof MODES[0])

/* ---- timing ------------------------------------------------------------------------------ */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* CPU time of the calling thread: unlike the wall clock, it stops while another process has
 * the CPU (--serve reports both). */
static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) static uint64_t time_calls(step_fn step, bench* b, long n) {
    uint64_t start = now_ns();
    for (long i = 0; i < n; ++i) step(b);
    return now_ns() - start;
}

/* Calls per sample so that one sample lasts about `seconds`. */
static long calibrate(step_fn step, bench* b, double seconds) {
    long n = 1;
    for (;;) {
        uint64_t elapsed = time_calls(step, b, n);
        if (elapsed >= 20000000u || n >= (1L << 30)) {   /* 20 ms measured: enough to scale */
            double per_call = (double)elapsed / (double)n;
            double want = seconds * 1e9 / (per_call > 0 ? per_call : 1);
            if (want < 1) want = 1;
            if (want > 2e9) want = 2e9;
            return (long)want;
        }
        n *= 2;
    }
}

static int compare_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

static void json_string(const char* s) {
    putchar('"');
    for (; *s; ++s) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static void measure(const char* mode, step_fn step, bench* b, const options* o) {
    time_calls(step, b, o->warmup);
    long n = o->iterations ? o->iterations : calibrate(step, b, o->seconds);
    double* samples = xcalloc((size_t)o->repeat, sizeof(double));
    double* sorted = xcalloc((size_t)o->repeat, sizeof(double));
    for (int r = 0; r < o->repeat; ++r) samples[r] = (double)time_calls(step, b, n) / (double)n;
    memcpy(sorted, samples, (size_t)o->repeat * sizeof(double));
    qsort(sorted, (size_t)o->repeat, sizeof(double), compare_double);
    double median = o->repeat % 2 ? sorted[o->repeat / 2]
                                  : (sorted[o->repeat / 2 - 1] + sorted[o->repeat / 2]) / 2;
    const char* model = strrchr(o->model, '/');
    printf("{\"mode\": ");
    json_string(mode);
    printf(", \"model\": ");
    json_string(model ? model + 1 : o->model);
    printf(", \"iterations\": %ld, \"repeat\": %d, \"ns_per_call\": %.1f, "
           "\"min_ns_per_call\": %.1f, \"samples\": [",
           n, o->repeat, median, sorted[0]);
    for (int r = 0; r < o->repeat; ++r) printf("%s%.1f", r ? ", " : "", samples[r]);
    printf("], \"inputs\": %zu, \"outputs\": %zu, \"intra_op_threads\": %d, "
           "\"inter_op_threads\": %d, \"execution_mode\": \"%s\", \"opt_level\": ",
           b->input_count, b->output_count, o->intra_threads, o->inter_threads,
           o->parallel ? "parallel" : "sequential");
    json_string(o->opt_level_name);
    printf(", \"ort_version\": ");
    json_string(runtime.version_string);
    printf(", \"api_version\": %u}\n", (unsigned)runtime.api_version);
    fflush(stdout);
    free(samples);
    free(sorted);
}

/* ---- serving a driver ---------------------------------------------------------------------- */

static void serve(bench* b, const options* o) {
    printf("{\"ready\": true, \"inputs\": %zu, \"outputs\": %zu, \"intra_op_threads\": %d, "
           "\"inter_op_threads\": %d, \"execution_mode\": \"%s\", \"opt_level\": ",
           b->input_count, b->output_count, o->intra_threads, o->inter_threads,
           o->parallel ? "parallel" : "sequential");
    json_string(o->opt_level_name);
    printf(", \"ort_version\": ");
    json_string(runtime.version_string);
    printf(", \"api_version\": %u}\n", (unsigned)runtime.api_version);
    fflush(stdout);
    char line[256];
    while (fgets(line, sizeof line, stdin) != NULL) {
        char name[64];
        long n = 0;
        char extra;
        int fields = sscanf(line, "%63s %ld %c", name, &n, &extra);
        if (fields >= 1 && strcmp(name, "quit") == 0) break;
        size_t m = 0;
        if (fields == 2 && n >= 1)
            while (m < MODE_COUNT && strcmp(MODES[m].name, name) != 0) ++m;
        if (fields != 2 || n < 1 || m == MODE_COUNT) {
            printf("{\"error\": \"expected 'MODE N' with a known mode and N >= 1\"}\n");
            fflush(stdout);
            continue;
        }
        uint64_t cpu_start = thread_cpu_ns();
        uint64_t elapsed = time_calls(MODES[m].step, b, n);
        uint64_t cpu = thread_cpu_ns() - cpu_start;
        printf("{\"mode\": \"%s\", \"iterations\": %ld, \"ns\": %llu, \"cpu_ns\": %llu}\n",
               MODES[m].name, n, (unsigned long long)elapsed, (unsigned long long)cpu);
        fflush(stdout);
    }
}

/* ---- main -------------------------------------------------------------------------------- */

int main(int argc, char** argv) {
    options o;
    parse_options(argc, argv, &o);

    /* Validate the modes before any work. */
    step_fn chosen[16];
    const char* chosen_names[16];
    size_t chosen_count = 0;
    char* modes = xcalloc(strlen(o.modes) + 1, 1);
    strcpy(modes, o.modes);
    for (char* tok = strtok(modes, ","); tok; tok = strtok(NULL, ",")) {
        size_t m = 0;
        while (m < MODE_COUNT && strcmp(MODES[m].name, tok) != 0) ++m;
        if (m == MODE_COUNT) die(2, "unknown mode '%s' (see --help)", tok);
        if (chosen_count == sizeof chosen / sizeof chosen[0]) die(2, "too many modes");
        chosen[chosen_count] = MODES[m].step;
        chosen_names[chosen_count++] = MODES[m].name;
    }
    if (chosen_count == 0) die(2, "--modes names no mode");

    load_runtime(o.library);
    bench b;
    memset(&b, 0, sizeof b);
    setup(&b, &o);
    if (o.serve)
        serve(&b, &o);
    else
        for (size_t m = 0; m < chosen_count; ++m) measure(chosen_names[m], chosen[m], &b, &o);
    teardown(&b);
    free(modes);
    for (size_t c = 0; c < o.config_count; ++c) free((void*)o.config_keys[c]);
    return 0;
}
