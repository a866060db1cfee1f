/* What kind of work a host runs slower (issue 45: the compiled kernels ran 2.4x slower on the
 * device machine's 16-core host than on the 2-core development machine, the C++ std::set loop
 * 1.5x): nanoseconds per step of
 *   - compute: a chain of splitmix64 steps (multiplies, shifts, xors; no memory), 
 *   - branches: a loop whose branch follows a pseudo-random bit (mispredicted half the time),
 *   - chase N: a random cyclic pointer chase over N bytes (latency of L1/L2/L3/DRAM).
 * Best of 3 each. Build: cc -O2 -o probe_cpu scripts/probe_cpu.c; run: ./probe_cpu */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static double compute(long n, uint64_t *sink)
{
    uint64_t z = 1;
    double t = now();
    for (long i = 0; i < n; i++)
        z = mix(z + 0x9E3779B97F4A7C15ULL);
    *sink += z;
    return (now() - t) / n * 1e9;
}

static double branches(long n, uint64_t *sink)
{
    uint64_t z = 7, acc = 0;
    double t = now();
    for (long i = 0; i < n; i++) {
        z = z * 6364136223846793005ULL + 1442695040888963407ULL;
        if (z >> 63)
            acc += z >> 7;
        else
            acc ^= z;
    }
    *sink += acc;
    return (now() - t) / n * 1e9;
}

static double chase(size_t bytes, long n, uint64_t *sink)
{
    size_t m = bytes / sizeof(size_t);
    size_t *next = malloc(m * sizeof(size_t)), *perm = malloc(m * sizeof(size_t));
    for (size_t i = 0; i < m; i++)
        perm[i] = i;
    uint64_t z = 3;
    for (size_t i = m - 1; i > 0; i--) { /* Fisher-Yates: one cycle through every slot (Sattolo) */
        z = mix(z + 0x9E3779B97F4A7C15ULL);
        size_t j = z % i;
        size_t tmp = perm[i]; perm[i] = perm[j]; perm[j] = tmp;
    }
    for (size_t i = 0; i < m; i++)
        next[perm[i]] = perm[(i + 1) % m];
    size_t p = 0;
    for (long i = 0; i < n / 4; i++) /* warm */
        p = next[p];
    double t = now();
    for (long i = 0; i < n; i++)
        p = next[p];
    double ns = (now() - t) / n * 1e9;
    *sink += p;
    free(next);
    free(perm);
    return ns;
}

static double best3(double (*f)(long, uint64_t *), long n, uint64_t *sink)
{
    double b = 1e30;
    for (int r = 0; r < 3; r++) {
        double x = f(n, sink);
        if (x < b) b = x;
    }
    return b;
}

int main(void)
{
    uint64_t sink = 0;
    printf("compute_ns %.3f\n", best3(compute, 50000000L, &sink));
    printf("branches_ns %.3f\n", best3(branches, 50000000L, &sink));
    size_t sizes[] = {32u << 10, 512u << 10, 4u << 20, 64u << 20};
    for (int k = 0; k < 4; k++) {
        double b = 1e30;
        for (int r = 0; r < 3; r++) {
            double x = chase(sizes[k], 5000000L, &sink);
            if (x < b) b = x;
        }
        printf("chase_%zuKiB_ns %.3f\n", sizes[k] >> 10, b);
    }
    fprintf(stderr, "%llu\n", (unsigned long long)sink);
    return 0;
}
