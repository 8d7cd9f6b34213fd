/*
 * Every internal header of the library, for the tests and programs that look inside it (and for
 * source files not yet moved to the headers they need). The library's own files include the
 * headers of the modules they use: each layer's folder holds one header per module
 * (docs/design.md, "Layers").
 */
#ifndef VMM_INTERNAL_H
#define VMM_INTERNAL_H

#include "base/base.h"
#include "base/errors.h"
#include "base/metadata.h"
#include "base/mutex.h"
#include "driver/driver.h"
#include "core/config.h"
#include "core/types.h"
#include "core/counters.h"
#include "core/pool.h"
#include "core/events.h"
#include "core/segment.h"
#include "core/alias.h"
#include "core/trace.h"
#include "core/capture.h"
#include "core/tcache.h"
#include "core/callbacks.h"
#include "core/lane.h"
#include "core/lock.h"
#include "features/mempool.h"
#include "features/sleep.h"
#include "features/ipc.h"
#include "features/pinned.h"
#include "api/group.h"
#include "api/history.h"
#include "api/sim_api.h"
#include "api/stats.h"

#endif /* VMM_INTERNAL_H */
