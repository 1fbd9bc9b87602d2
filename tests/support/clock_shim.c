/*
 * A test-only LD_PRELOAD shim that steps a live server's real-time clock.
 *
 * CLOCK_REALTIME, as seen through clock_gettime(), gettimeofday() and time(), reads either
 * the real time plus an offset, or a frozen instant. The file named by $RL_CLOCK_OFFSET_FILE
 * holds two little-endian words, mapped shared and read on every call, so a test moves the
 * clock by rewriting them in place:
 *
 *   bytes 0..8   int64   offset in microseconds (microseconds reach past the year 2554,
 *                        where the module's nanosecond time ends)
 *   bytes 8..16  uint64  frozen instant in ns since the epoch; 0: not frozen
 *
 * Monotonic clocks are left alone.
 *
 * Debian's libfaketime does not load into Debian's redis-server (it calls clock_gettime
 * recursively while jemalloc initialises), so this shim uses raw system calls only: it never
 * allocates and never calls back into the functions it replaces.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static void shift(struct timespec *ts, int64_t by_us) {
    int64_t ns = (int64_t)ts->tv_nsec + (by_us % 1000000) * 1000;
    ts->tv_sec += by_us / 1000000 + ns / 1000000000;
    ns %= 1000000000;
    if (ns < 0) {
        ns += 1000000000;
        ts->tv_sec -= 1;
    }
    ts->tv_nsec = ns;
}

/* The mapped words; (void *)1 while not (yet) available. */
static const volatile int64_t *offset_page = (const volatile int64_t *)1;

static const volatile int64_t *page(void) {
    const volatile int64_t *page = __atomic_load_n(&offset_page, __ATOMIC_ACQUIRE);
    if (page == (const volatile int64_t *)1) {
        const char *path = getenv("RL_CLOCK_OFFSET_FILE");
        void *mapped = MAP_FAILED;
        if (path != NULL) {
            long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                mapped = (void *)syscall(SYS_mmap, NULL, 2 * sizeof(int64_t), PROT_READ,
                                         MAP_SHARED, fd, 0);
                syscall(SYS_close, fd);
            }
        }
        page = mapped == MAP_FAILED ? NULL : (const volatile int64_t *)mapped;
        __atomic_store_n(&offset_page, page, __ATOMIC_RELEASE);
    }
    return page;
}

/* Reads the real-time clock as the test set it. */
static int realtime(clockid_t clock, struct timespec *ts) {
    int status = (int)syscall(SYS_clock_gettime, clock, ts);
    const volatile int64_t *words = page();
    if (status != 0 || words == NULL) {
        return status;
    }
    uint64_t frozen = (uint64_t)words[1];
    if (frozen != 0) {
        ts->tv_sec = (time_t)(frozen / 1000000000u);
        ts->tv_nsec = (long)(frozen % 1000000000u);
        return 0;
    }
    shift(ts, words[0]);
    return 0;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    if (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE) {
        return realtime(clock, ts);
    }
    return (int)syscall(SYS_clock_gettime, clock, ts);
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int status = realtime(CLOCK_REALTIME, &ts);
    if (status == 0 && tv != NULL) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return status;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (realtime(CLOCK_REALTIME, &ts) != 0) {
        return (time_t)-1;
    }
    if (out != NULL) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
