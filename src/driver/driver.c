/*
 * The driver contract's one entry (driver.h, vmm_driver_open): opens the implementation the
 * configuration names, so that code above the driver never names the simulator or CUDA.
 */
#include <stdio.h>

#include "driver/driver.h"

int vmm_driver_open(int kind, int ordinal, const vmm_sim_options *sim, vmm_driver **out, char *msg,
                    size_t msg_len)
{
    if (msg && msg_len)
        msg[0] = '\0';
    if (kind == VMM_DRIVER_SIM)
        return vmm_driver_sim_open(sim, out);
    if (kind == VMM_DRIVER_CUDA)
        return vmm_driver_cuda_open(ordinal, out, msg, msg_len);
    if (out)
        *out = NULL;
    if (msg && msg_len)
        snprintf(msg, msg_len, "vmm_driver_open: no driver of kind %d", kind);
    return VMM_DRV_INVALID_VALUE;
}
