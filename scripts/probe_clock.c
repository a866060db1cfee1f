/* What a clock read costs on this host, in ns (issue 39: the compiled hook reads CLOCK_MONOTONIC
 * once per event). Build and run: cc -O2 scripts/probe_clock.c -o /tmp/probe_clock && /tmp/probe_clock */
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>

static double ns_per(clockid_t id, long n)
{
    struct timespec a, b, t;
    clock_gettime(CLOCK_MONOTONIC, &a);
    volatile long sink = 0;
    for (long i = 0; i < n; i++) {
        clock_gettime(id, &t);
        sink += t.tv_nsec;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    (void)sink;
    return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
}

int main(void)
{
    long n = 2000000;
    printf("CLOCK_MONOTONIC %.1f ns\n", ns_per(CLOCK_MONOTONIC, n));
    printf("CLOCK_MONOTONIC_RAW %.1f ns\n", ns_per(CLOCK_MONOTONIC_RAW, n));
    printf("CLOCK_MONOTONIC_COARSE %.1f ns\n", ns_per(CLOCK_MONOTONIC_COARSE, n));
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    volatile uint64_t s = 0;
    for (long i = 0; i < n; i++)
        s += __rdtsc();
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("rdtsc %.1f ns\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
    return 0;
}
