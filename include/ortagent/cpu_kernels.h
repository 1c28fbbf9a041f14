/*
 * ortagent/cpu_kernels.h -- gradient kernels for onnxruntime's CPU provider, registered as the
 * custom-operator domain "ai.ortagent.cpu" (see ortagent_custom_op_v16 in ort_abi.h).
 *
 * Why: stock onnxruntime has no gradient operators (its training builds had them), so a
 * training graph writes the gradient of a normalisation as a dozen elementwise and reduction
 * nodes, each a pass over the activation and a few microseconds of dispatch. Each operator here
 * is one pass (two for the row statistics, three for MaskedSoftmax's rows) that computes what
 * torch's own kernel computes:
 *
 *   LayerNormalizationGrad(dY, X, scale, mean, inv_std) -> (dX, dscale, dbias),  attribute axis
 *     X viewed as [rows, cols], cols the product of X's dimensions from `axis` on; mean and
 *     inv_std the rows' statistics that ONNX LayerNormalization reports (rows elements each),
 *     scale cols elements. With xhat = (x - mean) * inv_std and g = dY * scale, per row
 *       dX = inv_std * (g - mean(g) - xhat * mean(g * xhat)),
 *     and over the rows dscale = sum(dY * xhat), dbias = sum(dY).
 *   BatchNormTrainingGrad(dY, X, scale, mean, var) -> (dX, dscale, dbias),  attribute epsilon
 *     X is [N, C, spatial...]; mean and var the batch's statistics per channel (var biased, as
 *     the forward normalised with), scale C elements. With inv_std = 1 / sqrt(var + epsilon),
 *     xhat = (x - mean) * inv_std and sums over N and the spatial axes per channel,
 *       dscale = sum(dY * xhat), dbias = sum(dY),
 *       dX = scale * inv_std * (dY - dbias / n - xhat * dscale / n).
 *
 *   GeluGrad(dY, X) -> dX
 *     the gradient of GELU (erf form), y = x * cdf(x) with cdf the normal distribution's:
 *     dX = dY * (cdf(x) + x * exp(-x^2 / 2) / sqrt(2 pi)), the CDF evaluated by the kernel.
 *
 *   SoftmaxGrad(dY, Y) -> dX
 *     the gradient of a softmax over the last axis from its output: dX = Y * (dY - sum(dY * Y)).
 *   MaskedSoftmax(X) -> Y
 *     the softmax over the last axis of scores masked with -inf (attention's masked_fill):
 *     Y = exp(X - max) / sum(exp(X - max)), each exponential by the kernel's own, an element
 *     more than 87 below its row's largest (-inf among them) exactly 0 (no exponential of
 *     -inf: onnxruntime's Softmax goes through subnormal floats there, 8-12x its unmasked
 *     time on this project's test machine); a row all -inf is NaN, as torch's and onnxruntime's are.
 *   ReluGrad(dY, X), HardSwishGrad(dY, X), HardSigmoidGrad(dY, X) -> dX  (attributes alpha, beta)
 *     the activations' gradients from their input (see ortagent_activation_grad_block).
 *   BatchNormTraining(X, scale, B) -> (Y, mean, var),  attribute epsilon
 *     the forward of training-mode BatchNorm over every axis but the channels: the batch's mean
 *     and biased variance per channel, and Y = X * a + b with a = scale / sqrt(var + epsilon),
 *     b = B - mean * a (torch's CPU kernel's form). An empty X has NaN statistics.
 *   SumLeadingAxes(X) -> Y,  attributes axes (how many leading axes), keepdims (default 1)
 *     the sum over X's first `axes` axes (ReduceSum of axes 0 .. axes - 1; the gradient of a
 *     bias, which broadcast over the rows): Y is X's trailing shape, after `axes` ones with
 *     keepdims. onnxruntime's ReduceSum of [512, 192] over axis 0 takes 14 us on one thread and
 *     72 us on two (its split of the rows between threads) on this project's test machine.
 *
 * float32 only. dscale and dbias are optional outputs (left unnamed, they are not written).
 * Work is split with KernelContext_ParallelFor over the session's intra-op threads, for tensors of
 * 65536 elements or more: rows in blocks for the LayerNorm (each block keeps its own partial
 * dscale/dbias, summed in block order, so the result does not depend on the thread count) and
 * the softmax, channels for the BatchNorm, blocks of elements for the rest.
 * The loops run over 8 floats at a time (the compilers' vector extension), sums kept per lane
 * and added at the end of a row or channel.
 *
 * The operator descriptions and the domain are process-wide and live as long as the process:
 * onnxruntime keeps pointers to them in every session created with the domain.
 */
#ifndef ORTAGENT_CPU_KERNELS_H
#define ORTAGENT_CPU_KERNELS_H

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ortagent/ort_call.h"

#define ORTAGENT_KERNELS_DOMAIN "ai.ortagent.cpu"
#define ORTAGENT_KERNELS_MAX_RANK 16
#define ORTAGENT_KERNELS_LANES 8
/* elements per work item of the row and elementwise kernels (LayerNorm rows in blocks of about
 * this many elements, each with its own partial dscale and dbias) */
#define ORTAGENT_KERNELS_BLOCK_ELEMENTS 16384
/* below this many elements a kernel runs on the calling thread alone: waking the session's
 * sleeping intra-op threads (ORTModule's sessions do not spin) costs more than they save */
#define ORTAGENT_KERNELS_PARALLEL_ELEMENTS 65536

/* No contraction of a * b + c into one fused multiply-add: a value computed twice (g = dY scale in
 * the LayerNorm's two passes) must round the same both times (fused, `g - mean(g)` of a row of
 * one element was the product's rounding error times 1 / sqrt(eps), not 0), and the baseline
 * and x86-64-v3 clones then give the same bits. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("O3", "fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

/* The loops are compiled twice on x86-64 Linux: for the baseline instruction set and for
 * x86-64-v3 (AVX2 and FMA), chosen when the module is loaded by what the CPU has (the
 * extension is built for the baseline). Measured on a [512, 64] LayerNorm gradient: 44 us
 * baseline, ... */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
#define ORTAGENT_KERNELS_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define ORTAGENT_KERNELS_CLONES
#endif

/* ---- tensors -------------------------------------------------------------------------------- */

typedef struct ortagent_kernel_tensor {
    float* data;
    int64_t dims[ORTAGENT_KERNELS_MAX_RANK];
    size_t rank;
    int64_t count;
} ortagent_kernel_tensor;

static OrtStatus* ortagent_kernel_error(const char* op, const char* what) {
    char message[256];
    snprintf(message, sizeof message, "%s (%s): %s", op, ORTAGENT_KERNELS_DOMAIN, what);
    return ORTAGENT_CALL(CreateStatus)(ORT_INVALID_ARGUMENT, message);
}

/* Shape, element count and data of a float tensor (a kernel's input or output). */
static OrtStatus* ortagent_kernel_describe(const char* op, const OrtValue* value, ortagent_kernel_tensor* out) {
    OrtTensorTypeAndShapeInfo* info = NULL;
    ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    OrtStatus* status = ORTAGENT_CALL(GetTensorTypeAndShape)(value, &info);
    if (status == NULL) status = ORTAGENT_CALL(GetTensorElementType)(info, &type);
    if (status == NULL) status = ORTAGENT_CALL(GetDimensionsCount)(info, &out->rank);
    if (status == NULL && type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)
        status = ortagent_kernel_error(op, "every tensor must be float32");
    if (status == NULL && out->rank > ORTAGENT_KERNELS_MAX_RANK)
        status = ortagent_kernel_error(op, "a tensor has more than 16 dimensions");
    if (status == NULL) status = ORTAGENT_CALL(GetDimensions)(info, out->dims, out->rank);
    if (info != NULL) ORTAGENT_CALL(ReleaseTensorTypeAndShapeInfo)(info);
    if (status == NULL) {
        out->count = 1;
        for (size_t i = 0; i < out->rank; ++i) out->count *= out->dims[i];
        status = ORTAGENT_CALL(GetTensorMutableData)((OrtValue*)value, (void**)&out->data);
    }
    return status;
}

static OrtStatus* ortagent_kernel_input(const char* op, OrtKernelContext* context, size_t index,
                                        ortagent_kernel_tensor* out) {
    const OrtValue* value = NULL;
    OrtStatus* status = ORTAGENT_CALL(KernelContext_GetInput)(context, index, &value);
    if (status == NULL && value == NULL) status = ortagent_kernel_error(op, "an input is missing");
    return status != NULL ? status : ortagent_kernel_describe(op, value, out);
}

/* Inputs 0 .. count - 1, in order. */
static OrtStatus* ortagent_kernel_inputs(const char* op, OrtKernelContext* context, ortagent_kernel_tensor* const* out,
                                         size_t count) {
    for (size_t i = 0; i < count; ++i) {
        OrtStatus* status = ortagent_kernel_input(op, context, i, out[i]);
        if (status != NULL) return status;
    }
    return NULL;
}

static int ortagent_kernel_same_shape(const ortagent_kernel_tensor* a, const ortagent_kernel_tensor* b) {
    return a->rank == b->rank && memcmp(a->dims, b->dims, a->rank * sizeof(int64_t)) == 0;
}

/* The output `index` shaped like `like`, or data NULL when the node leaves the output unnamed. */
static OrtStatus* ortagent_kernel_output(const char* op, OrtKernelContext* context, size_t index,
                                         const ortagent_kernel_tensor* like, ortagent_kernel_tensor* out) {
    OrtValue* value = NULL;
    size_t count = 0;
    OrtStatus* status = ORTAGENT_CALL(KernelContext_GetOutputCount)(context, &count);
    out->data = NULL;
    if (status != NULL || index >= count) return status;
    status = ORTAGENT_CALL(KernelContext_GetOutput)(context, index, like->dims, like->rank, &value);
    if (status != NULL || value == NULL) return status;
    return ortagent_kernel_describe(op, value, out);
}

/* Run fn(data, i) for i below `total` work items covering `elements` elements: on the session's
 * intra-op threads (KernelContext_ParallelFor) when there are enough elements to pay for waking
 * them (ORTAGENT_KERNELS_PARALLEL_ELEMENTS), on the calling thread otherwise. Each item writes
 * its own outputs, so the result is the same either way. */
static OrtStatus* ortagent_kernel_parallel(OrtKernelContext* context, ortagent_parallel_fn fn, int64_t total,
                                           int64_t elements, void* data) {
    if (total > 1 && elements >= ORTAGENT_KERNELS_PARALLEL_ELEMENTS)
        return ORTAGENT_CALL(KernelContext_ParallelFor)(context, fn, (size_t)total, 0, data);
    for (int64_t i = 0; i < total; ++i) fn(data, (size_t)i);
    return NULL;
}

/* A node's attribute `name`, or `fallback` where the node does not set it (the operators'
 * defaults, as ONNX's own operators have them). */
static int64_t ortagent_kernel_int_attribute(const OrtKernelInfo* info, const char* name, int64_t fallback) {
    int64_t value = fallback;
    OrtStatus* status = ORTAGENT_CALL(KernelInfoGetAttribute_int64)(info, name, &value);
    if (status == NULL) return value;
    ORTAGENT_CALL(ReleaseStatus)(status);
    return fallback;
}

static float ortagent_kernel_float_attribute(const OrtKernelInfo* info, const char* name, float fallback) {
    float value = fallback;
    OrtStatus* status = ORTAGENT_CALL(KernelInfoGetAttribute_float)(info, name, &value);
    if (status == NULL) return value;
    ORTAGENT_CALL(ReleaseStatus)(status);
    return fallback;
}

/* ---- LayerNormalizationGrad ----------------------------------------------------------------- */

typedef struct ortagent_layer_norm_grad_work {
    const float* dy;
    const float* x;
    const float* scale;
    const float* mean;
    const float* inv_std;
    float* dx;                /* NULL: not asked for */
    float* partials;          /* [blocks][2 * cols]: each block's dscale, then dbias */
    int64_t rows, cols, rows_per_block;
} ortagent_layer_norm_grad_work;

/* 8 floats as one value (GCC's and clang's vector extension): one AVX register in the
 * x86-64-v3 clone, two SSE registers in the baseline one. ortagent_f8u is the same at any
 * float's alignment, for unaligned loads and stores through a cast pointer. (Macros, not
 * functions: a function taking or returning a 32-byte vector has an ABI that differs with AVX.) */
typedef float ortagent_f8 __attribute__((vector_size(32)));
typedef float ortagent_f8u __attribute__((vector_size(32), aligned(4), __may_alias__));
#define ORTAGENT_F8 8
#define ORTAGENT_F8_LOAD(p) (*(const ortagent_f8u*)(const void*)(p))
#define ORTAGENT_F8_STORE(p, v) (*(ortagent_f8u*)(void*)(p) = (v))
#define ORTAGENT_F8_ADD_LANES(total, v)                                                       \
    do {                                                                                      \
        for (int lane_ = 0; lane_ < ORTAGENT_F8; ++lane_) (total) += (v)[lane_];              \
    } while (0)

/* One row: sum(g) and sum(g * xhat) with g = dy * scale, then dX and the row's share of dscale
 * and dbias, in a second pass. */
static inline void ortagent_layer_norm_grad_row(const float* restrict dy, const float* restrict x,
                                                const float* restrict scale, float mean, float inv_std,
                                                int64_t cols, float* restrict dx, float* restrict dscale,
                                                float* restrict dbias) {
    ortagent_f8 sum_g8 = {0}, sum_gx8 = {0};
    int64_t c = 0;
    for (; c + ORTAGENT_F8 <= cols; c += ORTAGENT_F8) {
        const ortagent_f8 xhat = (ORTAGENT_F8_LOAD(x + c) - mean) * inv_std;
        const ortagent_f8 g = ORTAGENT_F8_LOAD(dy + c) * ORTAGENT_F8_LOAD(scale + c);
        sum_g8 += g;
        sum_gx8 += g * xhat;
    }
    float sum_g = 0.0f, sum_gx = 0.0f;
    ORTAGENT_F8_ADD_LANES(sum_g, sum_g8);
    ORTAGENT_F8_ADD_LANES(sum_gx, sum_gx8);
    for (; c < cols; ++c) {
        const float xhat = (x[c] - mean) * inv_std;
        const float g = dy[c] * scale[c];
        sum_g += g;
        sum_gx += g * xhat;
    }
    const float mean_g = sum_g / (float)cols, mean_gx = sum_gx / (float)cols;
    for (c = 0; c + ORTAGENT_F8 <= cols; c += ORTAGENT_F8) {
        const ortagent_f8 d = ORTAGENT_F8_LOAD(dy + c);
        const ortagent_f8 xhat = (ORTAGENT_F8_LOAD(x + c) - mean) * inv_std;
        ORTAGENT_F8_STORE(dscale + c, ORTAGENT_F8_LOAD(dscale + c) + d * xhat);
        ORTAGENT_F8_STORE(dbias + c, ORTAGENT_F8_LOAD(dbias + c) + d);
        ORTAGENT_F8_STORE(dx + c, inv_std * (d * ORTAGENT_F8_LOAD(scale + c) - mean_g - xhat * mean_gx));
    }
    for (; c < cols; ++c) {
        const float xhat = (x[c] - mean) * inv_std;
        dscale[c] += dy[c] * xhat;
        dbias[c] += dy[c];
        dx[c] = inv_std * (dy[c] * scale[c] - mean_g - xhat * mean_gx);
    }
}

/* A row without dX asked for: its share of dscale and dbias only. */
static inline void ortagent_layer_norm_grad_row_params(const float* restrict dy, const float* restrict x,
                                                       float mean, float inv_std, int64_t cols,
                                                       float* restrict dscale, float* restrict dbias) {
    for (int64_t c = 0; c < cols; ++c) {
        dscale[c] += dy[c] * ((x[c] - mean) * inv_std);
        dbias[c] += dy[c];
    }
}

ORTAGENT_KERNELS_CLONES
static void ortagent_layer_norm_grad_block(void* data, size_t block) {
    const ortagent_layer_norm_grad_work* w = (const ortagent_layer_norm_grad_work*)data;
    const int64_t cols = w->cols;
    const int64_t first = (int64_t)block * w->rows_per_block;
    const int64_t last = first + w->rows_per_block < w->rows ? first + w->rows_per_block : w->rows;
    float* dscale = w->partials + (size_t)block * 2 * (size_t)cols;
    float* dbias = dscale + cols;
    memset(dscale, 0, 2 * (size_t)cols * sizeof(float));
    for (int64_t r = first; r < last; ++r) {
        if (w->dx != NULL)
            ortagent_layer_norm_grad_row(w->dy + r * cols, w->x + r * cols, w->scale, w->mean[r], w->inv_std[r], cols,
                                         w->dx + r * cols, dscale, dbias);
        else
            ortagent_layer_norm_grad_row_params(w->dy + r * cols, w->x + r * cols, w->mean[r], w->inv_std[r], cols,
                                                dscale, dbias);
    }
}

typedef struct ortagent_layer_norm_grad_kernel {
    int64_t axis;
} ortagent_layer_norm_grad_kernel;

static OrtStatus* ortagent_layer_norm_grad_compute(void* kernel, OrtKernelContext* context) {
    static const char op[] = "LayerNormalizationGrad";
    const ortagent_layer_norm_grad_kernel* k = (const ortagent_layer_norm_grad_kernel*)kernel;
    ortagent_kernel_tensor dy, x, scale, mean, inv_std, dx, dscale, dbias;
    OrtStatus* status = NULL;
    ortagent_kernel_tensor* const inputs[] = {&dy, &x, &scale, &mean, &inv_std};
    if ((status = ortagent_kernel_inputs(op, context, inputs, 5)) != NULL) return status;
    const int64_t rank = (int64_t)x.rank;
    const int64_t axis = k->axis < 0 ? k->axis + rank : k->axis;
    if (rank == 0 || axis < 0 || axis >= rank) return ortagent_kernel_error(op, "axis is outside X's dimensions");
    if (!ortagent_kernel_same_shape(&dy, &x))
        return ortagent_kernel_error(op, "dY and X differ in shape");
    int64_t rows = 1, cols = 1;
    for (int64_t i = 0; i < rank; ++i) *(i < axis ? &rows : &cols) *= x.dims[i];
    if (scale.count != cols) return ortagent_kernel_error(op, "scale does not have one element per normalised element");
    if (mean.count != rows || inv_std.count != rows)
        return ortagent_kernel_error(op, "mean and inv_std do not have one element per normalised row");
    if ((status = ortagent_kernel_output(op, context, 0, &x, &dx)) != NULL) return status;
    if ((status = ortagent_kernel_output(op, context, 1, &scale, &dscale)) != NULL) return status;
    if ((status = ortagent_kernel_output(op, context, 2, &scale, &dbias)) != NULL) return status;
    if (x.count == 0) {
        if (dscale.data != NULL && cols > 0) memset(dscale.data, 0, (size_t)cols * sizeof(float));
        if (dbias.data != NULL && cols > 0) memset(dbias.data, 0, (size_t)cols * sizeof(float));
        return NULL;
    }
    int64_t rows_per_block = ORTAGENT_KERNELS_BLOCK_ELEMENTS / cols;
    if (rows_per_block < 1) rows_per_block = 1;
    const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
    ortagent_layer_norm_grad_work work = {dy.data, x.data, scale.data, mean.data, inv_std.data, dx.data, NULL,
                                          rows, cols, rows_per_block};
    work.partials = (float*)malloc((size_t)blocks * 2 * (size_t)cols * sizeof(float));
    if (work.partials == NULL) return ORTAGENT_CALL(CreateStatus)(ORT_FAIL, "LayerNormalizationGrad: out of memory");
    status = ortagent_kernel_parallel(context, ortagent_layer_norm_grad_block, blocks, x.count, &work);
    if (status == NULL) {
        /* the blocks' partial sums, added in block order */
        for (int64_t b = 1; b < blocks; ++b) {
            const float* part = work.partials + (size_t)b * 2 * (size_t)cols;
            for (int64_t c = 0; c < 2 * cols; ++c) work.partials[c] += part[c];
        }
        if (dscale.data != NULL) memcpy(dscale.data, work.partials, (size_t)cols * sizeof(float));
        if (dbias.data != NULL) memcpy(dbias.data, work.partials + cols, (size_t)cols * sizeof(float));
    }
    free(work.partials);
    return status;
}

/* ---- BatchNormTrainingGrad ------------------------------------------------------------------ */

/* A BatchNorm's tensors, as [batch, channels, spatial] (the forward fills mean and var). */
typedef struct ortagent_batch_norm_work {
    const float* dy;          /* (the backward's) */
    const float* x;
    const float* scale;
    const float* bias;        /* (the forward's) */
    float* mean;
    float* var;
    float* out;               /* Y, or dX (NULL: not asked for) */
    float* dscale;            /* (the backward's; NULL: not asked for) */
    float* dbias;
    int64_t batch, channels, spatial;
    float epsilon;
} ortagent_batch_norm_work;

ORTAGENT_KERNELS_CLONES
static void ortagent_batch_norm_grad_channel(void* data, size_t channel) {
    const ortagent_batch_norm_work* w = (const ortagent_batch_norm_work*)data;
    const int64_t c = (int64_t)channel, spatial = w->spatial, stride = w->channels * spatial;
    const float mean = w->mean[c];
    const float inv_std = 1.0f / sqrtf(w->var[c] + w->epsilon);
    ortagent_f8 sum_dy8 = {0}, sum_dy_xc8 = {0};
    float sum_dy = 0.0f, sum_dy_xc = 0.0f;
    for (int64_t n = 0; n < w->batch; ++n) {
        const float* restrict dy = w->dy + n * stride + c * spatial;
        const float* restrict x = w->x + n * stride + c * spatial;
        int64_t s = 0;
        for (; s + ORTAGENT_F8 <= spatial; s += ORTAGENT_F8) {
            const ortagent_f8 d = ORTAGENT_F8_LOAD(dy + s);
            sum_dy8 += d;
            sum_dy_xc8 += d * (ORTAGENT_F8_LOAD(x + s) - mean);
        }
        for (; s < spatial; ++s) {
            sum_dy += dy[s];
            sum_dy_xc += dy[s] * (x[s] - mean);
        }
    }
    ORTAGENT_F8_ADD_LANES(sum_dy, sum_dy8);
    ORTAGENT_F8_ADD_LANES(sum_dy_xc, sum_dy_xc8);
    if (w->dscale != NULL) w->dscale[c] = sum_dy_xc * inv_std;
    if (w->dbias != NULL) w->dbias[c] = sum_dy;
    if (w->out == NULL) return;
    const float count = (float)(w->batch * spatial);
    const float mean_dy = sum_dy / count;
    const float projection = sum_dy_xc * inv_std * inv_std / count;
    const float gain = w->scale[c] * inv_std;
    for (int64_t n = 0; n < w->batch; ++n) {
        const float* restrict dy = w->dy + n * stride + c * spatial;
        const float* restrict x = w->x + n * stride + c * spatial;
        float* restrict dx = w->out + n * stride + c * spatial;
        int64_t s = 0;
        for (; s + ORTAGENT_F8 <= spatial; s += ORTAGENT_F8)
            ORTAGENT_F8_STORE(dx + s, gain * (ORTAGENT_F8_LOAD(dy + s) - mean_dy -
                                              (ORTAGENT_F8_LOAD(x + s) - mean) * projection));
        for (; s < spatial; ++s)
            dx[s] = gain * (dy[s] - mean_dy - (x[s] - mean) * projection);
    }
}

typedef struct ortagent_batch_norm_grad_kernel {
    float epsilon;
} ortagent_batch_norm_grad_kernel;

static OrtStatus* ortagent_batch_norm_grad_compute(void* kernel, OrtKernelContext* context) {
    static const char op[] = "BatchNormTrainingGrad";
    const ortagent_batch_norm_grad_kernel* k = (const ortagent_batch_norm_grad_kernel*)kernel;
    ortagent_kernel_tensor dy, x, scale, mean, var, dx, dscale, dbias;
    OrtStatus* status = NULL;
    ortagent_kernel_tensor* const inputs[] = {&dy, &x, &scale, &mean, &var};
    if ((status = ortagent_kernel_inputs(op, context, inputs, 5)) != NULL) return status;
    if (x.rank < 2) return ortagent_kernel_error(op, "X must be [N, C, ...]");
    if (!ortagent_kernel_same_shape(&dy, &x))
        return ortagent_kernel_error(op, "dY and X differ in shape");
    const int64_t batch = x.dims[0], channels = x.dims[1];
    if (scale.count != channels || mean.count != channels || var.count != channels)
        return ortagent_kernel_error(op, "scale, mean and var must have one element per channel");
    if ((status = ortagent_kernel_output(op, context, 0, &x, &dx)) != NULL) return status;
    if ((status = ortagent_kernel_output(op, context, 1, &scale, &dscale)) != NULL) return status;
    if ((status = ortagent_kernel_output(op, context, 2, &scale, &dbias)) != NULL) return status;
    if (channels == 0) return NULL;
    ortagent_batch_norm_work work = {dy.data, x.data, scale.data, NULL, mean.data, var.data, dx.data,
                                     dscale.data, dbias.data, batch, channels,
                                     x.count / (batch * channels > 0 ? batch * channels : 1), k->epsilon};
    if (x.count == 0) {
        if (dscale.data != NULL) memset(dscale.data, 0, (size_t)channels * sizeof(float));
        if (dbias.data != NULL) memset(dbias.data, 0, (size_t)channels * sizeof(float));
        return NULL;
    }
    return ortagent_kernel_parallel(context, ortagent_batch_norm_grad_channel, channels, x.count, &work);
}

/* ---- BatchNormTraining ----------------------------------------------------------------------- */

/* One channel: its mean, then its biased variance from the centred values (two passes, as
 * exact as the float sums allow), then y = x * a + b with a = scale / sqrt(var + eps) and
 * b = bias - mean * a, as torch's CPU kernel writes the normalisation. */
ORTAGENT_KERNELS_CLONES
static void ortagent_batch_norm_channel(void* data, size_t channel) {
    const ortagent_batch_norm_work* w = (const ortagent_batch_norm_work*)data;
    const int64_t c = (int64_t)channel, spatial = w->spatial, stride = w->channels * spatial;
    const float count = (float)(w->batch * spatial);
    ortagent_f8 sum8 = {0};
    float sum = 0.0f;
    for (int64_t n = 0; n < w->batch; ++n) {
        const float* restrict x = w->x + n * stride + c * spatial;
        int64_t s = 0;
        for (; s + ORTAGENT_F8 <= spatial; s += ORTAGENT_F8) sum8 += ORTAGENT_F8_LOAD(x + s);
        for (; s < spatial; ++s) sum += x[s];
    }
    ORTAGENT_F8_ADD_LANES(sum, sum8);
    const float mean = sum / count;
    ortagent_f8 squares8 = {0};
    float squares = 0.0f;
    for (int64_t n = 0; n < w->batch; ++n) {
        const float* restrict x = w->x + n * stride + c * spatial;
        int64_t s = 0;
        for (; s + ORTAGENT_F8 <= spatial; s += ORTAGENT_F8) {
            const ortagent_f8 centred = ORTAGENT_F8_LOAD(x + s) - mean;
            squares8 += centred * centred;
        }
        for (; s < spatial; ++s) squares += (x[s] - mean) * (x[s] - mean);
    }
    ORTAGENT_F8_ADD_LANES(squares, squares8);
    const float var = squares / count;
    if (w->mean != NULL) w->mean[c] = mean;
    if (w->var != NULL) w->var[c] = var;
    const float a = w->scale[c] / sqrtf(var + w->epsilon);
    const float b = w->bias[c] - mean * a;
    for (int64_t n = 0; n < w->batch; ++n) {
        const float* restrict x = w->x + n * stride + c * spatial;
        float* restrict y = w->out + n * stride + c * spatial;
        int64_t s = 0;
        for (; s + ORTAGENT_F8 <= spatial; s += ORTAGENT_F8) ORTAGENT_F8_STORE(y + s, ORTAGENT_F8_LOAD(x + s) * a + b);
        for (; s < spatial; ++s) y[s] = x[s] * a + b;
    }
}

static OrtStatus* ortagent_batch_norm_compute(void* kernel, OrtKernelContext* context) {
    static const char op[] = "BatchNormTraining";
    const ortagent_batch_norm_grad_kernel* k = (const ortagent_batch_norm_grad_kernel*)kernel;
    ortagent_kernel_tensor x, scale, bias, y, mean, var;
    OrtStatus* status = NULL;
    ortagent_kernel_tensor* const inputs[] = {&x, &scale, &bias};
    if ((status = ortagent_kernel_inputs(op, context, inputs, 3)) != NULL) return status;
    if (x.rank < 2) return ortagent_kernel_error(op, "X must be [N, C, ...]");
    const int64_t batch = x.dims[0], channels = x.dims[1];
    if (scale.count != channels || bias.count != channels)
        return ortagent_kernel_error(op, "scale and B must have one element per channel");
    if ((status = ortagent_kernel_output(op, context, 0, &x, &y)) != NULL) return status;
    if ((status = ortagent_kernel_output(op, context, 1, &scale, &mean)) != NULL) return status;
    if ((status = ortagent_kernel_output(op, context, 2, &scale, &var)) != NULL) return status;
    if (channels == 0) return NULL;
    if (x.count == 0) {
        /* an empty batch: no statistics (NaN, as a mean over nothing), an empty Y */
        for (int64_t c = 0; c < channels; ++c) {
            if (mean.data != NULL) mean.data[c] = NAN;
            if (var.data != NULL) var.data[c] = NAN;
        }
        return NULL;
    }
    ortagent_batch_norm_work work = {NULL, x.data, scale.data, bias.data, mean.data, var.data, y.data, NULL, NULL,
                                     batch, channels, x.count / (batch * channels), k->epsilon};
    return ortagent_kernel_parallel(context, ortagent_batch_norm_channel, channels, x.count, &work);
}

/* ---- the exponential and GeluGrad's normal CDF ------------------------------------------------ */

/* exp(z) of 8 floats z <= 0 (GeluGrad's -x^2 / 2, MaskedSoftmax's x - max): z = n ln2 + r with
 * |r| <= ln2 / 2 (ln2 in two parts, so that n ln2 is exact), exp(r) by its Taylor polynomial of
 * degree 6 (relative error below 1.3e-7 there; 2.5e-7 overall, measured against exp), 2^n put
 * in the exponent bits. z below ORTAGENT_EXP_FLOOR (-inf included) gives exp(-87), 1.6e-38, the
 * smallest the kernels compute: a product with a subnormal float result takes a slow path on
 * some CPUs (MaskedSoftmax on [16, 4, 32, 32] with -inf, one row at a time: 138 us with a
 * floor of -87.3, 97 us at -87). GeluGrad multiplies it by x or by the CDF's polynomial (no
 * difference a float result holds), MaskedSoftmax replaces it by 0. A macro: see ortagent_f8. */
#define ORTAGENT_EXP_FLOOR -87.0f
typedef int32_t ortagent_i8 __attribute__((vector_size(32)));
#define ORTAGENT_F8_EXP_NONPOSITIVE(result, z_in)                                              \
    do {                                                                                      \
        ortagent_f8 z_ = (z_in);                                                              \
        const ortagent_i8 low_ = z_ < ORTAGENT_EXP_FLOOR; /* lanes of -1 (true) and 0 */    \
        const ortagent_f8 floor_ = (ortagent_f8){0} + ORTAGENT_EXP_FLOOR;                     \
        z_ = (ortagent_f8)(((ortagent_i8)z_ & ~low_) | ((ortagent_i8)floor_ & low_));         \
        /* round to the nearest integer: adding and removing 1.5 * 2^23 drops the fraction */ \
        const ortagent_f8 n_ = (z_ * 1.44269504f + 12582912.0f) - 12582912.0f;                 \
        const ortagent_f8 r_ = (z_ - n_ * 0.693145752f) - n_ * 1.42860677e-06f;                \
        ortagent_f8 p_ = r_ * (1.0f / 720) + (1.0f / 120);                                    \
        p_ = p_ * r_ + (1.0f / 24);                                                           \
        p_ = p_ * r_ + (1.0f / 6);                                                            \
        p_ = p_ * r_ + 0.5f;                                                                  \
        p_ = p_ * r_ + 1.0f;                                                                  \
        p_ = p_ * r_ + 1.0f;                                                                  \
        const ortagent_i8 bits_ = (__builtin_convertvector(n_, ortagent_i8) + 127) << 23;      \
        (result) = p_ * (ortagent_f8)bits_;                                                   \
    } while (0)

/* The normal distribution's CDF of 8 floats x, 0.5 * erfc(-x / sqrt(2)), with `e` = exp(-x^2 / 2)
 * given. With t = |x| / sqrt(2) and u = 1 / (1 + 0.45 t), erfc(t) = exp(-t^2) * u * Q(u) for every
 * t >= 0, Q a polynomial of degree 9 least-squares fitted by the project (numpy, float64,
 * relative error weighting, t over [0, 10]): one formula and one division for every lane, no
 * selection between regions. Against math.erfc in float64 over [-20, 20] (the kernel's
 * arithmetic in float32): GeluGrad's dX (dY = 1) within 1.6e-7 (torch's gelu backward: 2.2e-7),
 * relative error of the CDF <= 4.1e-6 where it is below 0.16 (the tail). A macro: see
 * ortagent_f8. */
#define ORTAGENT_F8_NORMAL_CDF(result, x_in, e_in)                                             \
    do {                                                                                      \
        const ortagent_f8 x_ = (x_in), e_ = (e_in);                                           \
        const ortagent_f8 t_ = (ortagent_f8)((ortagent_i8)x_ & 0x7fffffff) * 0.70710678f;      \
        const ortagent_f8 u_ = 1.0f / (t_ * 0.45f + 1.0f);                                    \
        ortagent_f8 q_ = u_ * -3.8710705936e-02f + 1.7502370477e-01f;                         \
        q_ = q_ * u_ - 2.6173105836e-01f;                                                     \
        q_ = q_ * u_ + 8.8800840080e-02f;                                                     \
        q_ = q_ * u_ + 2.2863293067e-02f;                                                     \
        q_ = q_ * u_ + 9.5829099417e-02f;                                                     \
        q_ = q_ * u_ + 1.8335920572e-01f;                                                     \
        q_ = q_ * u_ + 2.2662149370e-01f;                                                     \
        q_ = q_ * u_ + 2.5406730175e-01f;                                                     \
        q_ = q_ * u_ + 2.5387674570e-01f;                                                     \
        const ortagent_f8 half_erfc_ = 0.5f * e_ * (u_ * q_);                                 \
        const ortagent_i8 negative_ = x_ < 0.0f;                                              \
        (result) = (ortagent_f8)(((ortagent_i8)half_erfc_ & negative_) |                      \
                                 ((ortagent_i8)(1.0f - half_erfc_) & ~negative_));            \
    } while (0)

/* ---- MaskedSoftmax and SoftmaxGrad ------------------------------------------------------------ */

/* rows of the last axis, in blocks of rows_per_block: SoftmaxGrad's (dY, Y) -> dX, MaskedSoftmax's
 * X -> Y (dy NULL) */
typedef struct ortagent_softmax_work {
    const float* dy;
    const float* input;     /* SoftmaxGrad's Y, MaskedSoftmax's X */
    float* output;          /* SoftmaxGrad's dX, MaskedSoftmax's Y */
    int64_t rows, cols, rows_per_block;
} ortagent_softmax_work;

/* exp(z) of 8 floats z <= 0, 0 below ORTAGENT_EXP_FLOOR (MaskedSoftmax's e; a macro: see ortagent_f8) */
#define ORTAGENT_F8_EXP_OR_ZERO(result, z_in)                                                  \
    do {                                                                                      \
        const ortagent_f8 z0_ = (z_in);                                                       \
        ORTAGENT_F8_EXP_NONPOSITIVE(result, z0_);                                             \
        (result) = (ortagent_f8)((ortagent_i8)(result) & ~(z0_ < ORTAGENT_EXP_FLOOR));        \
    } while (0)

/* Per row of the last axis: the largest element m (lanes kept apart, NaN never chosen: a NaN
 * reaches Y through its exponential), e = exp(x - m) with 0 where x - m < -87 (and where x is
 * -inf), then Y = e / sum(e) as e * (1 / sum). Four rows at a time, each pass over the four
 * together: one row's maximum, exponentials and sum are a chain of dependent operations as long
 * as a short row's work (a [16, 4, 32, 32] softmax: 99 us a row at a time, 77 us four at a
 * time; torch's 60 us, onnxruntime's 38 us without -inf and 300-480 us with). A block's last
 * group of four repeats its last row where it has fewer (computed, not written). */
ORTAGENT_KERNELS_CLONES
static void ortagent_masked_softmax_block(void* data, size_t block) {
    enum { ROWS = 4 };
    const ortagent_softmax_work* w = (const ortagent_softmax_work*)data;
    const int64_t cols = w->cols;
    const int64_t first = (int64_t)block * w->rows_per_block;
    const int64_t last = first + w->rows_per_block < w->rows ? first + w->rows_per_block : w->rows;
    const ortagent_f8 lowest = (ortagent_f8){0} - INFINITY;
    for (int64_t r = first; r < last; r += ROWS) {
        const int64_t rows_here = last - r < ROWS ? last - r : ROWS;   /* rows k >= this: not written */
        const float* x[ROWS];
        float* y[ROWS];
        ortagent_f8 max8[ROWS], sum8[ROWS];
        float largest[ROWS], sum[ROWS], inverse[ROWS];
        for (int k = 0; k < ROWS; ++k) {
            const int64_t row = r + k < last ? r + k : last - 1;
            x[k] = w->input + row * cols;
            y[k] = w->output + row * cols;
            max8[k] = lowest;
            sum8[k] = (ortagent_f8){0};
            largest[k] = -INFINITY;
            sum[k] = 0.0f;
        }
        int64_t c = 0;
        for (; c + ORTAGENT_F8 <= cols; c += ORTAGENT_F8)
            for (int k = 0; k < ROWS; ++k) {
                const ortagent_f8 v = ORTAGENT_F8_LOAD(x[k] + c);
                const ortagent_i8 above = v > max8[k];
                max8[k] = (ortagent_f8)(((ortagent_i8)v & above) | ((ortagent_i8)max8[k] & ~above));
            }
        const int64_t tail = c;
        for (int k = 0; k < ROWS; ++k) {
            for (c = tail; c < cols; ++c) largest[k] = x[k][c] > largest[k] ? x[k][c] : largest[k];
            for (int lane = 0; lane < ORTAGENT_F8; ++lane)
                largest[k] = max8[k][lane] > largest[k] ? max8[k][lane] : largest[k];
        }
        for (c = 0; c + ORTAGENT_F8 <= cols; c += ORTAGENT_F8)
            for (int k = 0; k < ROWS; ++k) {
                ortagent_f8 e;
                ORTAGENT_F8_EXP_OR_ZERO(e, ORTAGENT_F8_LOAD(x[k] + c) - largest[k]);
                if (k < rows_here) ORTAGENT_F8_STORE(y[k] + c, e);
                sum8[k] += e;
            }
        for (int k = 0; k < rows_here && tail < cols; ++k) {     /* through a group of 8 padded with the largest */
            float padded[ORTAGENT_F8];
            for (int lane = 0; lane < ORTAGENT_F8; ++lane)
                padded[lane] = tail + lane < cols ? x[k][tail + lane] : largest[k];
            ortagent_f8 e;
            ORTAGENT_F8_EXP_OR_ZERO(e, ORTAGENT_F8_LOAD(padded) - largest[k]);
            for (int lane = 0; tail + lane < cols; ++lane) {
                y[k][tail + lane] = e[lane];
                sum[k] += e[lane];
            }
        }
        for (int k = 0; k < ROWS; ++k) {
            ORTAGENT_F8_ADD_LANES(sum[k], sum8[k]);
            inverse[k] = 1.0f / sum[k];
        }
        for (c = 0; c + ORTAGENT_F8 <= cols; c += ORTAGENT_F8)
            for (int k = 0; k < ROWS; ++k)
                if (k < rows_here) ORTAGENT_F8_STORE(y[k] + c, ORTAGENT_F8_LOAD(y[k] + c) * inverse[k]);
        for (int k = 0; k < rows_here; ++k)
            for (c = tail; c < cols; ++c) y[k][c] *= inverse[k];
    }
}

/* the rows of the last axis of `y` (the forward's X), in blocks for KernelContext_ParallelFor */
static OrtStatus* ortagent_softmax_rows(OrtKernelContext* context, ortagent_parallel_fn fn,
                                        ortagent_softmax_work* work, const ortagent_kernel_tensor* y) {
    const int64_t cols = y->dims[y->rank - 1];
    if (y->count == 0 || cols == 0 || work->output == NULL) return NULL;
    work->cols = cols;
    work->rows = y->count / cols;
    work->rows_per_block = ORTAGENT_KERNELS_BLOCK_ELEMENTS / cols;
    if (work->rows_per_block < 1) work->rows_per_block = 1;
    const int64_t blocks = (work->rows + work->rows_per_block - 1) / work->rows_per_block;
    return ortagent_kernel_parallel(context, fn, blocks, y->count, work);
}

static OrtStatus* ortagent_masked_softmax_compute(void* kernel, OrtKernelContext* context) {
    static const char op[] = "MaskedSoftmax";
    (void)kernel;
    ortagent_kernel_tensor x, y;
    OrtStatus* status = NULL;
    ortagent_kernel_tensor* const inputs[] = {&x};
    if ((status = ortagent_kernel_inputs(op, context, inputs, 1)) != NULL) return status;
    if (x.rank == 0) return ortagent_kernel_error(op, "X must have an axis to normalise over");
    if ((status = ortagent_kernel_output(op, context, 0, &x, &y)) != NULL) return status;
    ortagent_softmax_work work = {NULL, x.data, y.data, 0, 0, 0};
    return ortagent_softmax_rows(context, ortagent_masked_softmax_block, &work, &x);
}

/* Per row of the last axis: dX = Y * (dY - sum(dY * Y)), softmax's Jacobian applied to dY. */
ORTAGENT_KERNELS_CLONES
static void ortagent_softmax_grad_block(void* data, size_t block) {
    const ortagent_softmax_work* w = (const ortagent_softmax_work*)data;
    const int64_t cols = w->cols;
    const int64_t first = (int64_t)block * w->rows_per_block;
    const int64_t last = first + w->rows_per_block < w->rows ? first + w->rows_per_block : w->rows;
    for (int64_t r = first; r < last; ++r) {
        const float* restrict dy = w->dy + r * cols;
        const float* restrict y = w->input + r * cols;
        float* restrict dx = w->output + r * cols;
        ortagent_f8 sum8 = {0};
        float sum = 0.0f;
        int64_t c = 0;
        for (; c + ORTAGENT_F8 <= cols; c += ORTAGENT_F8) sum8 += ORTAGENT_F8_LOAD(dy + c) * ORTAGENT_F8_LOAD(y + c);
        for (; c < cols; ++c) sum += dy[c] * y[c];
        ORTAGENT_F8_ADD_LANES(sum, sum8);
        for (c = 0; c + ORTAGENT_F8 <= cols; c += ORTAGENT_F8)
            ORTAGENT_F8_STORE(dx + c, ORTAGENT_F8_LOAD(y + c) * (ORTAGENT_F8_LOAD(dy + c) - sum));
        for (; c < cols; ++c) dx[c] = y[c] * (dy[c] - sum);
    }
}

static OrtStatus* ortagent_softmax_grad_compute(void* kernel, OrtKernelContext* context) {
    static const char op[] = "SoftmaxGrad";
    (void)kernel;
    ortagent_kernel_tensor dy, y, dx;
    OrtStatus* status = NULL;
    ortagent_kernel_tensor* const inputs[] = {&dy, &y};
    if ((status = ortagent_kernel_inputs(op, context, inputs, 2)) != NULL) return status;
    if (y.rank == 0) return ortagent_kernel_error(op, "Y must have an axis to normalise over");
    if (!ortagent_kernel_same_shape(&dy, &y))
        return ortagent_kernel_error(op, "dY and Y differ in shape");
    if ((status = ortagent_kernel_output(op, context, 0, &y, &dx)) != NULL) return status;
    ortagent_softmax_work work = {dy.data, y.data, dx.data, 0, 0, 0};
    return ortagent_softmax_rows(context, ortagent_softmax_grad_block, &work, &y);
}

/* ---- ReluGrad, HardSwishGrad, HardSigmoidGrad, GeluGrad ------------------------------------ */

enum { ORTAGENT_RELU, ORTAGENT_HARD_SWISH, ORTAGENT_HARD_SIGMOID, ORTAGENT_GELU };

typedef struct ortagent_activation_grad_kernel {
    int kind;
    float alpha, beta;        /* HardSigmoid's */
} ortagent_activation_grad_kernel;

typedef struct ortagent_activation_grad_work {
    const float* dy;
    const float* x;
    float* dx;
    int64_t count, per_block;
    ortagent_activation_grad_kernel k;
} ortagent_activation_grad_work;

/* dX from dY and the forward's input X:
 *   Relu:        dY where X > 0, else 0 (selected, as torch's threshold_backward: no 0 * inf)
 *   HardSwish:   dY * slope, slope 0 up to -3 (included), X / 3 + 1/2 inside, 1 from 3 on and at
 *                NaN (ortagent's rule for HardSwish, torch's hardswish_backward)
 *   HardSigmoid: dY * (alpha where 0 < alpha X + beta < 1, else 0) (onnx-ad's rule)
 *   Gelu:        dY * (cdf(X) + X * pdf(X)), the derivative of X * cdf(X), with pdf(X) =
 *                exp(-X^2 / 2) / sqrt(2 pi) and the CDF from the same exponential
 *                (ORTAGENT_F8_NORMAL_CDF); the last elements through a zero-padded step of
 *                32, so that every element is computed by the same vector code */
ORTAGENT_KERNELS_CLONES
static void ortagent_activation_grad_block(void* data, size_t block) {
    const ortagent_activation_grad_work* w = (const ortagent_activation_grad_work*)data;
    const int64_t first = (int64_t)block * w->per_block;
    const int64_t last = first + w->per_block < w->count ? first + w->per_block : w->count;
    const float* restrict dy = w->dy;
    const float* restrict x = w->x;
    float* restrict dx = w->dx;
    const ortagent_f8 zero = {0}, one = zero + 1.0f, alpha = zero + w->k.alpha;
    int64_t i = first;
    switch (w->k.kind) {
    case ORTAGENT_RELU:
        for (; i + ORTAGENT_F8 <= last; i += ORTAGENT_F8) {
            const ortagent_i8 positive = ORTAGENT_F8_LOAD(x + i) > 0.0f;
            ORTAGENT_F8_STORE(dx + i, (ortagent_f8)((ortagent_i8)ORTAGENT_F8_LOAD(dy + i) & positive));
        }
        for (; i < last; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
        break;
    case ORTAGENT_HARD_SWISH:
        for (; i + ORTAGENT_F8 <= last; i += ORTAGENT_F8) {
            const ortagent_f8 v = ORTAGENT_F8_LOAD(x + i);
            const ortagent_i8 above = v > -3.0f, below = v < 3.0f;
            const ortagent_f8 inside = (ortagent_f8)((ortagent_i8)(v / 3.0f + 0.5f) & above);
            const ortagent_f8 slope = (ortagent_f8)(((ortagent_i8)inside & below) | ((ortagent_i8)one & ~below));
            ORTAGENT_F8_STORE(dx + i, ORTAGENT_F8_LOAD(dy + i) * slope);
        }
        for (; i < last; ++i)
            dx[i] = dy[i] * (x[i] < 3.0f ? (x[i] > -3.0f ? x[i] / 3.0f + 0.5f : 0.0f) : 1.0f);
        break;
    case ORTAGENT_GELU: {
        /* four groups of 8 per step: one group's exponential, division and polynomials are a
         * chain of dependent operations, four independent chains keep the vector units busy
         * (GeluGrad of [16, 32, 256]: 225 -> 164 us, torch's gelu backward 98 us with FMA) */
        enum { GROUPS = 4, STEP = GROUPS * ORTAGENT_F8 };
        float tail_x[STEP] = {0}, tail_dy[STEP] = {0}, tail_dx[STEP];
        for (; i < last; i += STEP) {
            const int full = i + STEP <= last;
            if (!full) {
                memcpy(tail_x, x + i, (size_t)(last - i) * sizeof(float));
                memcpy(tail_dy, dy + i, (size_t)(last - i) * sizeof(float));
            }
            const float* const group_x = full ? x + i : tail_x;
            const float* const group_dy = full ? dy + i : tail_dy;
            float* const group_dx = full ? dx + i : tail_dx;
            ortagent_f8 v[GROUPS], e[GROUPS], cdf[GROUPS];
            for (int g = 0; g < GROUPS; ++g) v[g] = ORTAGENT_F8_LOAD(group_x + g * ORTAGENT_F8);
            for (int g = 0; g < GROUPS; ++g) ORTAGENT_F8_EXP_NONPOSITIVE(e[g], v[g] * v[g] * -0.5f);
            for (int g = 0; g < GROUPS; ++g) ORTAGENT_F8_NORMAL_CDF(cdf[g], v[g], e[g]);
            for (int g = 0; g < GROUPS; ++g)
                ORTAGENT_F8_STORE(group_dx + g * ORTAGENT_F8, ORTAGENT_F8_LOAD(group_dy + g * ORTAGENT_F8) *
                                                               (cdf[g] + v[g] * e[g] * 0.398942280f));
            if (!full) memcpy(dx + i, tail_dx, (size_t)(last - i) * sizeof(float));
        }
        break;
    }
    default:
        for (; i + ORTAGENT_F8 <= last; i += ORTAGENT_F8) {
            const ortagent_f8 line = ORTAGENT_F8_LOAD(x + i) * w->k.alpha + w->k.beta;
            const ortagent_i8 inside = (line > 0.0f) & (line < 1.0f);
            ORTAGENT_F8_STORE(dx + i, ORTAGENT_F8_LOAD(dy + i) * (ortagent_f8)((ortagent_i8)alpha & inside));
        }
        for (; i < last; ++i) {
            const float line = x[i] * w->k.alpha + w->k.beta;
            dx[i] = dy[i] * (line > 0.0f && line < 1.0f ? w->k.alpha : 0.0f);
        }
        break;
    }
}

static OrtStatus* ortagent_activation_grad_compute(void* kernel, OrtKernelContext* context) {
    static const char op[] = "activation gradient (ReluGrad, HardSwishGrad, HardSigmoidGrad, GeluGrad)";
    ortagent_kernel_tensor dy, x, dx;
    OrtStatus* status = NULL;
    ortagent_kernel_tensor* const inputs[] = {&dy, &x};
    if ((status = ortagent_kernel_inputs(op, context, inputs, 2)) != NULL) return status;
    if (!ortagent_kernel_same_shape(&dy, &x))
        return ortagent_kernel_error(op, "dY and X differ in shape");
    if ((status = ortagent_kernel_output(op, context, 0, &x, &dx)) != NULL) return status;
    if (x.count == 0 || dx.data == NULL) return NULL;
    const int64_t per_block = 4 * ORTAGENT_KERNELS_BLOCK_ELEMENTS;
    const int64_t blocks = (x.count + per_block - 1) / per_block;
    ortagent_activation_grad_work work = {dy.data, x.data, dx.data, x.count, per_block,
                                          *(const ortagent_activation_grad_kernel*)kernel};
    return ortagent_kernel_parallel(context, ortagent_activation_grad_block, blocks, x.count, &work);
}

static OrtStatus* ortagent_activation_grad_create(const OrtKernelInfo* info, int kind, void** kernel) {
    ortagent_activation_grad_kernel* k = (ortagent_activation_grad_kernel*)malloc(sizeof *k);
    if (k == NULL) return ORTAGENT_CALL(CreateStatus)(ORT_FAIL, "activation gradient: out of memory");
    k->kind = kind;
    k->alpha = 0.2f;            /* HardSigmoid's defaults */
    k->beta = 0.5f;
    if (kind == ORTAGENT_HARD_SIGMOID) {
        k->alpha = ortagent_kernel_float_attribute(info, "alpha", k->alpha);
        k->beta = ortagent_kernel_float_attribute(info, "beta", k->beta);
    }
    *kernel = k;
    return NULL;
}

#define ORTAGENT_ACTIVATION_CREATE(name, kind)                                                \
    static OrtStatus* name(const ortagent_custom_op_v16* op, const void* api, const OrtKernelInfo* info, \
                           void** kernel) {                                                   \
        (void)op;                                                                             \
        (void)api;                                                                            \
        return ortagent_activation_grad_create(info, kind, kernel);                           \
    }
ORTAGENT_ACTIVATION_CREATE(ortagent_relu_grad_create, ORTAGENT_RELU)
ORTAGENT_ACTIVATION_CREATE(ortagent_hard_swish_grad_create, ORTAGENT_HARD_SWISH)
ORTAGENT_ACTIVATION_CREATE(ortagent_hard_sigmoid_grad_create, ORTAGENT_HARD_SIGMOID)
ORTAGENT_ACTIVATION_CREATE(ortagent_gelu_grad_create, ORTAGENT_GELU)

/* ---- SumLeadingAxes ----------------------------------------------------------------------------- */

/* X viewed as [rows, cols] (rows the product of the summed leading axes): per column, the rows
 * in runs of ORTAGENT_SUM_RUN_ROWS added one after another, each run's total then added to the
 * column's; rows in groups of ORTAGENT_SUM_GROUP_ROWS, each group's totals kept apart and the
 * groups added in order at the end. Work items are (group, block of columns): the order of the
 * additions is fixed by the shape alone, whatever the thread count. */
#define ORTAGENT_SUM_RUN_ROWS 64
#define ORTAGENT_SUM_GROUP_ROWS 4096
#define ORTAGENT_SUM_BLOCK_VECTORS 8  /* columns per work item: 8 groups of 8 */

typedef struct ortagent_leading_sum_work {
    const float* x;
    float* totals;            /* [groups][cols]: Y itself when there is one group */
    int64_t rows, cols, column_blocks;
} ortagent_leading_sum_work;

ORTAGENT_KERNELS_CLONES
static void ortagent_leading_sum_item(void* data, size_t item) {
    const ortagent_leading_sum_work* w = (const ortagent_leading_sum_work*)data;
    const int64_t group = (int64_t)item / w->column_blocks, block = (int64_t)item % w->column_blocks;
    const int64_t width = ORTAGENT_SUM_BLOCK_VECTORS * ORTAGENT_F8;
    const int64_t first_col = block * width;
    const int64_t cols = w->cols - first_col < width ? w->cols - first_col : width;
    const int64_t vectors = cols / ORTAGENT_F8, tail = cols % ORTAGENT_F8;
    const int64_t first_row = group * ORTAGENT_SUM_GROUP_ROWS;
    const int64_t end_row = first_row + ORTAGENT_SUM_GROUP_ROWS < w->rows ? first_row + ORTAGENT_SUM_GROUP_ROWS
                                                                           : w->rows;
    ortagent_f8 total[ORTAGENT_SUM_BLOCK_VECTORS], run[ORTAGENT_SUM_BLOCK_VECTORS];
    float total_tail[ORTAGENT_F8], run_tail[ORTAGENT_F8];
    memset(total, 0, sizeof total);
    memset(total_tail, 0, sizeof total_tail);
    for (int64_t r = first_row; r < end_row; r += ORTAGENT_SUM_RUN_ROWS) {
        const int64_t run_end = r + ORTAGENT_SUM_RUN_ROWS < end_row ? r + ORTAGENT_SUM_RUN_ROWS : end_row;
        memset(run, 0, sizeof run);
        memset(run_tail, 0, sizeof run_tail);
        if (vectors == ORTAGENT_SUM_BLOCK_VECTORS) {
            /* a whole block: a loop of constant length, whose sums the compiler keeps in registers */
            for (int64_t q = r; q < run_end; ++q) {
                const float* row = w->x + q * w->cols + first_col;
                for (int v = 0; v < ORTAGENT_SUM_BLOCK_VECTORS; ++v) run[v] += ORTAGENT_F8_LOAD(row + v * ORTAGENT_F8);
            }
        } else {
            for (int64_t q = r; q < run_end; ++q) {
                const float* row = w->x + q * w->cols + first_col;
                for (int64_t v = 0; v < vectors; ++v) run[v] += ORTAGENT_F8_LOAD(row + v * ORTAGENT_F8);
                for (int64_t t = 0; t < tail; ++t) run_tail[t] += row[vectors * ORTAGENT_F8 + t];
            }
        }
        for (int64_t v = 0; v < vectors; ++v) total[v] += run[v];
        for (int64_t t = 0; t < tail; ++t) total_tail[t] += run_tail[t];
    }
    float* out = w->totals + group * w->cols + first_col;
    for (int64_t v = 0; v < vectors; ++v) ORTAGENT_F8_STORE(out + v * ORTAGENT_F8, total[v]);
    for (int64_t t = 0; t < tail; ++t) out[vectors * ORTAGENT_F8 + t] = total_tail[t];
}

typedef struct ortagent_leading_sum_kernel {
    int64_t axes;             /* how many leading axes are summed */
    int64_t keepdims;
} ortagent_leading_sum_kernel;

static OrtStatus* ortagent_leading_sum_compute(void* kernel, OrtKernelContext* context) {
    static const char op[] = "SumLeadingAxes";
    const ortagent_leading_sum_kernel* k = (const ortagent_leading_sum_kernel*)kernel;
    ortagent_kernel_tensor x, y, shape;
    OrtStatus* status = ortagent_kernel_input(op, context, 0, &x);
    if (status != NULL) return status;
    if (k->axes < 1 || k->axes > (int64_t)x.rank)
        return ortagent_kernel_error(op, "X has fewer dimensions than the axes to sum");
    int64_t rows = 1, cols = 1;
    shape.rank = 0;
    for (int64_t i = 0; i < (int64_t)x.rank; ++i) {
        if (i < k->axes) {
            rows *= x.dims[i];
            if (k->keepdims) shape.dims[shape.rank++] = 1;
        } else {
            cols *= x.dims[i];
            shape.dims[shape.rank++] = x.dims[i];
        }
    }
    if ((status = ortagent_kernel_output(op, context, 0, &shape, &y)) != NULL) return status;
    if (y.data == NULL || cols == 0) return NULL;
    if (rows == 0) {
        memset(y.data, 0, (size_t)cols * sizeof(float));
        return NULL;
    }
    const int64_t groups = (rows + ORTAGENT_SUM_GROUP_ROWS - 1) / ORTAGENT_SUM_GROUP_ROWS;
    const int64_t width = ORTAGENT_SUM_BLOCK_VECTORS * ORTAGENT_F8;
    ortagent_leading_sum_work work = {x.data, y.data, rows, cols, (cols + width - 1) / width};
    if (groups > 1) {
        work.totals = (float*)malloc((size_t)groups * (size_t)cols * sizeof(float));
        if (work.totals == NULL) return ORTAGENT_CALL(CreateStatus)(ORT_FAIL, "SumLeadingAxes: out of memory");
    }
    status = ortagent_kernel_parallel(context, ortagent_leading_sum_item, groups * work.column_blocks, x.count, &work);
    if (groups > 1) {
        if (status == NULL) {
            /* the groups' totals, added in group order */
            memcpy(y.data, work.totals, (size_t)cols * sizeof(float));
            for (int64_t g = 1; g < groups; ++g) {
                const float* part = work.totals + g * cols;
                for (int64_t c = 0; c < cols; ++c) y.data[c] += part[c];
            }
        }
        free(work.totals);
    }
    return status;
}

/* ---- the operator descriptions ---------------------------------------------------------------- */

static const char* ortagent_kernel_name(const ortagent_custom_op_v16* op);

static ONNXTensorElementDataType ortagent_kernel_float_type(const ortagent_custom_op_v16* op, size_t index) {
    (void)op;
    (void)index;
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
static size_t ortagent_kernel_five(const ortagent_custom_op_v16* op) { (void)op; return 5; }
static size_t ortagent_kernel_three(const ortagent_custom_op_v16* op) { (void)op; return 3; }
static size_t ortagent_kernel_two(const ortagent_custom_op_v16* op) { (void)op; return 2; }
static size_t ortagent_kernel_one(const ortagent_custom_op_v16* op) { (void)op; return 1; }
static OrtStatus* ortagent_kernel_create_stateless(const ortagent_custom_op_v16* op, const void* api,
                                                   const OrtKernelInfo* info, void** kernel) {
    (void)op;
    (void)api;
    (void)info;
    *kernel = NULL;
    return NULL;
}
static const char* ortagent_kernel_cpu_provider(const ortagent_custom_op_v16* op) {
    (void)op;
    return "CPUExecutionProvider";
}
static OrtCustomOpInputOutputCharacteristic ortagent_kernel_required(const ortagent_custom_op_v16* op, size_t index) {
    (void)op;
    (void)index;
    return INPUT_OUTPUT_REQUIRED;
}
/* dX is always computed; dscale and dbias only where the node names them */
static OrtCustomOpInputOutputCharacteristic ortagent_kernel_output_kind(const ortagent_custom_op_v16* op,
                                                                         size_t index) {
    (void)op;
    return index == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
}
static OrtMemType ortagent_kernel_memory(const ortagent_custom_op_v16* op, size_t index) {
    (void)op;
    (void)index;
    return OrtMemTypeDefault;
}
static int ortagent_kernel_arity(const ortagent_custom_op_v16* op) { (void)op; return 1; }
static void ortagent_kernel_destroy(void* kernel) { free(kernel); }      /* (free(NULL) does nothing) */
static void* ortagent_kernel_create_v1(const ortagent_custom_op_v16* op, const void* api, const OrtKernelInfo* info) {
    /* never called: version 16 makes onnxruntime call CreateKernelV2 */
    (void)op;
    (void)api;
    (void)info;
    return NULL;
}
static void ortagent_kernel_compute_v1(void* kernel, OrtKernelContext* context) {
    (void)kernel;
    (void)context;
}

static OrtStatus* ortagent_layer_norm_grad_create(const ortagent_custom_op_v16* op, const void* api,
                                                  const OrtKernelInfo* info, void** kernel) {
    (void)op;
    (void)api;
    ortagent_layer_norm_grad_kernel* k = (ortagent_layer_norm_grad_kernel*)malloc(sizeof *k);
    if (k == NULL) return ORTAGENT_CALL(CreateStatus)(ORT_FAIL, "LayerNormalizationGrad: out of memory");
    k->axis = ortagent_kernel_int_attribute(info, "axis", -1);     /* LayerNormalization's default */
    *kernel = k;
    return NULL;
}

static OrtStatus* ortagent_batch_norm_grad_create(const ortagent_custom_op_v16* op, const void* api,
                                                  const OrtKernelInfo* info, void** kernel) {
    (void)op;
    (void)api;
    ortagent_batch_norm_grad_kernel* k = (ortagent_batch_norm_grad_kernel*)malloc(sizeof *k);
    if (k == NULL) return ORTAGENT_CALL(CreateStatus)(ORT_FAIL, "BatchNormTrainingGrad: out of memory");
    k->epsilon = ortagent_kernel_float_attribute(info, "epsilon", 1e-5f);   /* BatchNormalization's default */
    *kernel = k;
    return NULL;
}

static OrtStatus* ortagent_leading_sum_create(const ortagent_custom_op_v16* op, const void* api,
                                               const OrtKernelInfo* info, void** kernel) {
    (void)op;
    (void)api;
    ortagent_leading_sum_kernel* k = (ortagent_leading_sum_kernel*)malloc(sizeof *k);
    if (k == NULL) return ORTAGENT_CALL(CreateStatus)(ORT_FAIL, "SumLeadingAxes: out of memory");
    k->keepdims = ortagent_kernel_int_attribute(info, "keepdims", 1);     /* ReduceSum's default */
    OrtStatus* status = ORTAGENT_CALL(KernelInfoGetAttribute_int64)(info, "axes", &k->axes);
    if (status != NULL) {
        ORTAGENT_CALL(ReleaseStatus)(status);
        free(k);
        return ortagent_kernel_error("SumLeadingAxes",
                                     "the attribute axes (an integer: how many leading axes) is required");
    }
    *kernel = k;
    return NULL;
}

#define ORTAGENT_KERNEL_OP(inputs, outputs, create, compute)                                 \
    {16, ortagent_kernel_create_v1, ortagent_kernel_name, ortagent_kernel_cpu_provider,       \
     ortagent_kernel_float_type, inputs, ortagent_kernel_float_type,                          \
     outputs, ortagent_kernel_compute_v1, ortagent_kernel_destroy,                            \
     ortagent_kernel_required, ortagent_kernel_output_kind, ortagent_kernel_memory,           \
     ortagent_kernel_arity, ortagent_kernel_arity, ortagent_kernel_arity, ortagent_kernel_arity, \
     create, compute}

static const ortagent_custom_op_v16 ortagent_kernel_ops[] = {
    ORTAGENT_KERNEL_OP(ortagent_kernel_five, ortagent_kernel_three, ortagent_layer_norm_grad_create,
                       ortagent_layer_norm_grad_compute),
    ORTAGENT_KERNEL_OP(ortagent_kernel_five, ortagent_kernel_three, ortagent_batch_norm_grad_create,
                       ortagent_batch_norm_grad_compute),
    ORTAGENT_KERNEL_OP(ortagent_kernel_two, ortagent_kernel_one, ortagent_gelu_grad_create,
                       ortagent_activation_grad_compute),
    ORTAGENT_KERNEL_OP(ortagent_kernel_three, ortagent_kernel_three, ortagent_batch_norm_grad_create,
                       ortagent_batch_norm_compute),
    ORTAGENT_KERNEL_OP(ortagent_kernel_two, ortagent_kernel_one, ortagent_relu_grad_create,
                       ortagent_activation_grad_compute),
    ORTAGENT_KERNEL_OP(ortagent_kernel_two, ortagent_kernel_one, ortagent_hard_swish_grad_create,
                       ortagent_activation_grad_compute),
    ORTAGENT_KERNEL_OP(ortagent_kernel_two, ortagent_kernel_one, ortagent_hard_sigmoid_grad_create,
                       ortagent_activation_grad_compute),
    ORTAGENT_KERNEL_OP(ortagent_kernel_two, ortagent_kernel_one, ortagent_kernel_create_stateless,
                       ortagent_softmax_grad_compute),
    ORTAGENT_KERNEL_OP(ortagent_kernel_one, ortagent_kernel_one, ortagent_kernel_create_stateless,
                       ortagent_masked_softmax_compute),
    ORTAGENT_KERNEL_OP(ortagent_kernel_one, ortagent_kernel_one, ortagent_leading_sum_create,
                       ortagent_leading_sum_compute),
};
static const char* const ortagent_kernel_names[] = {"LayerNormalizationGrad", "BatchNormTrainingGrad", "GeluGrad",
                                                    "BatchNormTraining", "ReluGrad", "HardSwishGrad",
                                                    "HardSigmoidGrad", "SoftmaxGrad", "MaskedSoftmax",
                                                    "SumLeadingAxes"};
#define ORTAGENT_KERNEL_COUNT (sizeof ortagent_kernel_ops / sizeof ortagent_kernel_ops[0])

static const char* ortagent_kernel_name(const ortagent_custom_op_v16* op) {
    return ortagent_kernel_names[op - ortagent_kernel_ops];
}

/* ---- the domain ------------------------------------------------------------------------------- */

static pthread_mutex_t ortagent_kernels_lock = PTHREAD_MUTEX_INITIALIZER;
static OrtCustomOpDomain* ortagent_kernels_domain;

/* Add the domain (created on first use) to `options`. */
static OrtStatus* ortagent_add_cpu_kernels(OrtSessionOptions* options) {
    OrtStatus* status = NULL;
    pthread_mutex_lock(&ortagent_kernels_lock);
    if (ortagent_kernels_domain == NULL) {
        OrtCustomOpDomain* domain = NULL;
        status = ORTAGENT_CALL(CreateCustomOpDomain)(ORTAGENT_KERNELS_DOMAIN, &domain);
        for (size_t i = 0; status == NULL && i < ORTAGENT_KERNEL_COUNT; ++i)
            status = ORTAGENT_CALL(CustomOpDomain_Add)(domain, (const OrtCustomOp*)&ortagent_kernel_ops[i]);
        if (status == NULL)
            ortagent_kernels_domain = domain;
        else if (domain != NULL)
            ORTAGENT_CALL(ReleaseCustomOpDomain)(domain);
    }
    OrtCustomOpDomain* domain = ortagent_kernels_domain;
    pthread_mutex_unlock(&ortagent_kernels_lock);
    return status != NULL ? status : ORTAGENT_CALL(AddCustomOpDomain)(options, domain);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

#endif /* ORTAGENT_CPU_KERNELS_H */
