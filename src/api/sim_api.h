/*
 * API: the simulated device's entry points (sim_api.c, vmmalloc_sim.h), the one module above the
 * driver that talks to the simulator itself.
 */
#ifndef VMM_SIM_API_H
#define VMM_SIM_API_H

#include "core/types.h"

/* The simulated device's counters (stats JSON): 0 with *out filled on the sim, else nonzero (a
 * real GPU, or the sim refused); sets no error message. */
int vmm_sim_counters_of(vmm_allocator *a, vmm_sim_counters *out);

#endif /* VMM_SIM_API_H */
