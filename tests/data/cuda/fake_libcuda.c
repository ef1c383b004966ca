/* A stand-in for libcuda.so.1 with the six driver calls tests/gpu/cuda_client.py makes, for its unit test.
 * The device has FAKE_CUDA_TOTAL_MIB (default 1024) MiB; like an MPS client, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
 * ("0=<n>M") lowers both what cuMemGetInfo reports and what cuMemAlloc grants (CUDA_ERROR_OUT_OF_MEMORY = 2
 * past it). FAKE_CUDA_NO_DEVICE=1 makes cuInit fail with CUDA_ERROR_NO_DEVICE (100). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static size_t used, limit;

static size_t env_mib(const char *name, size_t dflt) {
    const char *v = getenv(name);
    return v ? (size_t)strtoull(v, NULL, 10) << 20 : dflt;
}

int cuInit(unsigned int flags) {
    (void)flags;
    const char *no = getenv("FAKE_CUDA_NO_DEVICE");
    if (no && strcmp(no, "1") == 0) return 100;
    limit = env_mib("FAKE_CUDA_TOTAL_MIB", (size_t)1024 << 20);
    const char *mps = getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    if (mps && strncmp(mps, "0=", 2) == 0) {
        size_t m = (size_t)strtoull(mps + 2, NULL, 10) << 20;
        if (m < limit) limit = m;
    }
    return 0;
}

int cuDeviceGet(int *dev, int ordinal) { if (ordinal != 0) return 101; *dev = 0; return 0; }
int cuCtxCreate_v2(void **ctx, unsigned int flags, int dev) { (void)flags; (void)dev; *ctx = (void *)&used; return 0; }
int cuMemGetInfo_v2(size_t *free_b, size_t *total_b) { *total_b = limit; *free_b = limit - used; return 0; }

int cuMemAlloc_v2(uint64_t *ptr, size_t size) {
    if (used + size > limit) return 2;
    used += size;
    *ptr = (uint64_t)used;
    return 0;
}

int cuMemFree_v2(uint64_t ptr) { (void)ptr; return 0; }

int cuGetErrorName(int code, const char **name) {
    switch (code) {
    case 2: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
    case 100: *name = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 101: *name = "CUDA_ERROR_INVALID_DEVICE"; return 0;
    default: return 1;
    }
}
