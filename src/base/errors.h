/*
 * Base layer: status codes with a message (error.c). Thread safe: the message is per thread.
 */
#ifndef VMM_ERRORS_H
#define VMM_ERRORS_H

#include <stdarg.h>

#include "base/base.h"
#include "vmmalloc.h" /* status codes */

/* A driver call's result (driver/driver.h, "Contract"): each value equals the CUresult CUDA returns
 * in that case. Here, below the driver, so that error.c names and maps results without including
 * a higher layer's header. */
typedef enum vmm_drv_result {
    VMM_DRV_SUCCESS = 0,
    VMM_DRV_INVALID_VALUE = 1,
    VMM_DRV_OUT_OF_MEMORY = 2,
    VMM_DRV_NOT_INITIALIZED = 3,
    VMM_DRV_NO_DEVICE = 100,
    VMM_DRV_INVALID_DEVICE = 101,
    VMM_DRV_INVALID_HANDLE = 400,
    VMM_DRV_NOT_READY = 600,
    VMM_DRV_NOT_SUPPORTED = 801,
    /* Stream capture (CUDA graphs): see "Capture" in the contract above. */
    VMM_DRV_STREAM_CAPTURE_UNSUPPORTED = 900, /* not permitted while (this) capture goes on */
    VMM_DRV_STREAM_CAPTURE_INVALIDATED = 901, /* the capture was invalidated by an earlier error */
    VMM_DRV_STREAM_CAPTURE_MERGE = 902,       /* would merge two captures */
    VMM_DRV_STREAM_CAPTURE_UNMATCHED = 903,   /* ended on another stream than it began on */
    VMM_DRV_STREAM_CAPTURE_ISOLATION = 905,   /* capturing stream waits on an uncaptured event */
    VMM_DRV_STREAM_CAPTURE_IMPLICIT = 906,    /* legacy stream next to a blocking capture */
    VMM_DRV_CAPTURED_EVENT = 907,             /* query / sync of an event recorded in capture */
    VMM_DRV_STREAM_CAPTURE_WRONG_THREAD = 908, /* ended by another thread than its owner */
    VMM_DRV_UNKNOWN = 999,
} vmm_drv_result;

/* Name of a result ("CUDA_ERROR_INVALID_VALUE" style) for messages: the contract's kinds from a
 * table, any other CUresult from the loaded CUDA driver's cuGetErrorName. */
const char *vmm_drv_result_name(int r);
/* Used by drv_cuda.c once libcuda is loaded: names for results outside the table (NULL: unknown). */
void vmm_drv_set_result_namer(const char *(*namer)(int));

/* Set this thread's vmm_last_error() text and return `status` (so callers can `return vmm_fail(...)`). */
int vmm_fail(int status, const char *fmt, ...) VMM_PRINTF(2, 3);
/* Map a driver result to a status code: OUT_OF_MEMORY -> VMM_ENOMEM, NO_DEVICE & co -> VMM_ENODEV,
 * NOT_SUPPORTED -> VMM_ENOTSUP, anything else -> VMM_EDRIVER. */
int vmm_status_from_drv(int drv_result);
/* vmm_fail with the driver call named: "<what>: CUDA_ERROR_X (n)". */
int vmm_fail_drv(int drv_result, const char *what);
/* Clear this thread's last error (successful calls leave it alone; only tests need this). */
void vmm_clear_error(void);

#endif /* VMM_ERRORS_H */
