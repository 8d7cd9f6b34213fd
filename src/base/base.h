/*
 * Base layer: what every file of the library uses (sizes, attributes, branch hints).
 */
#ifndef VMM_BASE_H
#define VMM_BASE_H

#include <stddef.h>
#include <stdint.h>

#define VMM_KiB ((size_t)1 << 10)
#define VMM_MiB ((size_t)1 << 20)
#define VMM_GiB ((size_t)1 << 30)

#if defined(__GNUC__)
#define VMM_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define VMM_LIKELY(x) __builtin_expect(!!(x), 1)
#define VMM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define VMM_PRINTF(f, a)
#define VMM_LIKELY(x) (x)
#define VMM_UNLIKELY(x) (x)
#endif

/* The largest power of two not above x (x > 0). */
static inline size_t vmm_floor_pow2(size_t x)
{
    return (size_t)1 << (63 - __builtin_clzll((unsigned long long)x));
}

#endif /* VMM_BASE_H */
