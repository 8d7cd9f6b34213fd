/*
 * Base layer: status codes with a message (error.c). Thread safe: the message is per thread.
 */
#ifndef VMM_ERRORS_H
#define VMM_ERRORS_H

#include <stdarg.h>

#include "base/base.h"
#include "vmmalloc.h" /* status codes */

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
