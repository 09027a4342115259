/* An LD_PRELOAD library that meters a process's heap like salus-server's own heap meter (node/src/heap_meter.rs,
 * malloc_hooks.rs): every block of the malloc family counts its malloc_usable_size while a window is open, and the
 * window's peak rise is read back. It lets a test measure, in TensorFlow's own process, the quantity the server
 * measures for an eager call: the kernels' own scratch (Eigen's contraction buffers, oneDNN's) included, which
 * TensorFlow's allocator statistics do not see. Python reaches it with ctypes.CDLL(None).
 * Built by the tests with `cc -shared -fPIC -O2`. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *ptr, size_t size);
extern void __libc_free(void *ptr);
extern void *__libc_memalign(size_t alignment, size_t size);
extern void *__libc_valloc(size_t size);
extern void *__libc_pvalloc(size_t size);

static atomic_bool metering;
static atomic_long net_bytes;
static atomic_long peak_bytes;

static void on_alloc(void *ptr) {
    if (ptr == NULL || !atomic_load_explicit(&metering, memory_order_relaxed)) return;
    long bytes = (long)malloc_usable_size(ptr);
    long now = atomic_fetch_add_explicit(&net_bytes, bytes, memory_order_relaxed) + bytes;
    long seen = atomic_load_explicit(&peak_bytes, memory_order_relaxed);
    while (now > seen &&
           !atomic_compare_exchange_weak_explicit(&peak_bytes, &seen, now, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
}

static void on_free(void *ptr) {
    if (ptr == NULL || !atomic_load_explicit(&metering, memory_order_relaxed)) return;
    atomic_fetch_sub_explicit(&net_bytes, (long)malloc_usable_size(ptr), memory_order_relaxed);
}

void salus_heap_meter_start(void) {
    atomic_store(&net_bytes, 0);
    atomic_store(&peak_bytes, 0);
    atomic_store(&metering, 1);
}

/* Closes the window; returns its peak rise in bytes. */
long salus_heap_meter_stop(void) {
    atomic_store(&metering, 0);
    return atomic_load(&peak_bytes);
}

void *malloc(size_t size) {
    void *ptr = __libc_malloc(size);
    on_alloc(ptr);
    return ptr;
}

void *calloc(size_t count, size_t size) {
    void *ptr = __libc_calloc(count, size);
    on_alloc(ptr);
    return ptr;
}

void *realloc(void *ptr, size_t size) {
    on_free(ptr);
    void *moved = __libc_realloc(ptr, size);
    on_alloc(moved == NULL && size != 0 ? ptr : moved);  /* a failed realloc leaves the old block live */
    return moved;
}

void free(void *ptr) {
    on_free(ptr);
    __libc_free(ptr);
}

void *memalign(size_t alignment, size_t size) {
    void *ptr = __libc_memalign(alignment, size);
    on_alloc(ptr);
    return ptr;
}

void *aligned_alloc(size_t alignment, size_t size) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
        errno = EINVAL;
        return NULL;
    }
    return memalign(alignment, size);
}

int posix_memalign(void **out, size_t alignment, size_t size) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment % sizeof(void *) != 0) return EINVAL;
    void *ptr = memalign(alignment, size);
    if (ptr == NULL) return ENOMEM;
    *out = ptr;
    return 0;
}

void *valloc(size_t size) {
    void *ptr = __libc_valloc(size);
    on_alloc(ptr);
    return ptr;
}

void *pvalloc(size_t size) {
    void *ptr = __libc_pvalloc(size);
    on_alloc(ptr);
    return ptr;
}
