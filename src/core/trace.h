/*
 * Core: trace points. Core and feature code records events (VMM_TRACE_*) with VMM_HISTORY; the
 * history (api/history.c) registers its recorder in a->hooks.trace when recording starts, so no
 * code below it names it.
 */
#ifndef VMM_TRACE_H
#define VMM_TRACE_H

#include "core/types.h"

/* Record an event; caller holds the lock. Its cost while history is off is one predictable
 * branch. */
#define VMM_HISTORY(a, action, addr, size, stream)                                            \
    do {                                                                                      \
        if (VMM_UNLIKELY((a)->history != NULL))                                               \
            (a)->hooks.trace((a), (action), (uintptr_t)(addr), (size_t)(size), (stream));    \
    } while (0)

#endif /* VMM_TRACE_H */
