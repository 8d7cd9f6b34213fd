/* Status codes, their texts, and the per-thread last-error message. */
#include <stdio.h>
#include <string.h>

#include "base/errors.h"

enum { ERROR_MESSAGE_MAX = 2048 }; /* room for the OOM report with its numbers */

static _Thread_local char last_error[ERROR_MESSAGE_MAX];

VMM_API const char *vmm_strerror(int status)
{
    switch (status) {
#define VMM_STATUS_TEXT_(name, value, text) \
    case value:                             \
        return text;
        VMM_STATUS_MAP(VMM_STATUS_TEXT_)
#undef VMM_STATUS_TEXT_
    default:
        return "unknown status";
    }
}

VMM_API const char *vmm_status_name(int status)
{
    switch (status) {
#define VMM_STATUS_NAME_(name, value, text) \
    case value:                             \
        return #name;
        VMM_STATUS_MAP(VMM_STATUS_NAME_)
#undef VMM_STATUS_NAME_
    default:
        return "UNKNOWN";
    }
}

VMM_API const char *vmm_last_error(void) { return last_error; }

void vmm_clear_error(void) { last_error[0] = '\0'; }

int vmm_fail(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

/* Set once by the cuda driver when libcuda is loaded (cuGetErrorName knows every CUresult). */
static _Atomic(const char *(*)(int)) drv_namer;

void vmm_drv_set_result_namer(const char *(*namer)(int)) { drv_namer = namer; }

const char *vmm_drv_result_name(int r)
{
    switch (r) {
    case VMM_DRV_SUCCESS: return "CUDA_SUCCESS";
    case VMM_DRV_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case VMM_DRV_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case VMM_DRV_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case VMM_DRV_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case VMM_DRV_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case VMM_DRV_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case VMM_DRV_NOT_READY: return "CUDA_ERROR_NOT_READY";
    case VMM_DRV_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case VMM_DRV_STREAM_CAPTURE_UNSUPPORTED: return "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
    case VMM_DRV_STREAM_CAPTURE_INVALIDATED: return "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED";
    case VMM_DRV_STREAM_CAPTURE_MERGE: return "CUDA_ERROR_STREAM_CAPTURE_MERGE";
    case VMM_DRV_STREAM_CAPTURE_UNMATCHED: return "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED";
    case VMM_DRV_STREAM_CAPTURE_WRONG_THREAD: return "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD";
    case VMM_DRV_STREAM_CAPTURE_ISOLATION: return "CUDA_ERROR_STREAM_CAPTURE_ISOLATION";
    case VMM_DRV_STREAM_CAPTURE_IMPLICIT: return "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT";
    case VMM_DRV_CAPTURED_EVENT: return "CUDA_ERROR_CAPTURED_EVENT";
    case VMM_DRV_UNKNOWN: return "CUDA_ERROR_UNKNOWN";
    default: {
        const char *(*namer)(int) = drv_namer;
        const char *name = namer ? namer(r) : NULL;
        return name ? name : "CUDA_ERROR_(unnamed: no driver loaded to name it)";
    }
    }
}

int vmm_status_from_drv(int r)
{
    switch (r) {
    case VMM_DRV_SUCCESS: return VMM_OK;
    case VMM_DRV_OUT_OF_MEMORY: return VMM_ENOMEM;
    case VMM_DRV_NOT_INITIALIZED:
    case VMM_DRV_NO_DEVICE:
    case VMM_DRV_INVALID_DEVICE: return VMM_ENODEV;
    case VMM_DRV_NOT_SUPPORTED: return VMM_ENOTSUP;
    default: return VMM_EDRIVER;
    }
}

int vmm_fail_drv(int r, const char *what)
{
    return vmm_fail(vmm_status_from_drv(r), "%s: %s (%d)", what, vmm_drv_result_name(r), r);
}
