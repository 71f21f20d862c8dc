/*
 * nvml_sim.c — a simulated NVML (libnvidia-ml.so.1). Not built by build.rs: tests
 * (tests/verdicts.rs, tests/reliability.rs) compile it into a temporary directory and put that
 * directory on LD_LIBRARY_PATH. Only the entry points the shim reaches are here (through
 * nvml-wrapper, which looks every symbol up and fails only when a missing one is called).
 *
 * SIMNVML_PROCESSES: "PID:BYTES[,PID:BYTES...]", the compute processes every device lists
 *   (none when unset). No graphics processes.
 * SIMNVML_MODE (NVML present but failing; unset = everything works):
 *   init-fails   nvmlInit_v2 returns NVML_ERROR_DRIVER_NOT_LOADED (9)
 *   no-device    init succeeds; nvmlDeviceGetHandleByIndex_v2/ByUUID return NVML_ERROR_GPU_IS_LOST (15)
 *   list-fails   the device is found; listing its processes returns NVML_ERROR_UNKNOWN (999)
 * SIMNVML_DELAY_MS: nvmlInit_v2 sleeps this long first (an NVML that hangs for a while).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

static const char *mode(void) {
    const char *m = getenv("SIMNVML_MODE");
    return m != NULL ? m : "ok";
}

nvmlReturn_t nvmlInit_v2(void) {
    const char *d = getenv("SIMNVML_DELAY_MS");
    if (d != NULL) {
        long ms = atol(d);
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    return strcmp(mode(), "init-fails") == 0 ? NVML_ERROR_DRIVER_NOT_LOADED : NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return nvmlInit_v2();
}

nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t r) { return r == 0 ? "Success" : "simulated NVML failure"; }

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    (void)version;
    (void)length;
    return NVML_ERROR_UNKNOWN;
}

static nvmlReturn_t handle(nvmlDevice_t *device) {
    if (device == NULL) return 1;
    if (strcmp(mode(), "no-device") == 0) return NVML_ERROR_GPU_IS_LOST;
    *device = (nvmlDevice_t)(unsigned long)0x1000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    (void)index;
    return handle(device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    (void)uuid;
    return handle(device);
}

#define MAX_PROCS 64

/* SIMNVML_PROCESSES parsed into `out` (at most MAX_PROCS); returns how many. */
static unsigned int listed(nvmlProcessInfo_t *out) {
    const char *s = getenv("SIMNVML_PROCESSES");
    unsigned int n = 0;
    while (s != NULL && *s != '\0' && n < MAX_PROCS) {
        char *end = NULL;
        unsigned long pid = strtoul(s, &end, 10);
        if (end == s || *end != ':') break;
        s = end + 1;
        unsigned long long bytes = strtoull(s, &end, 10);
        if (end == s) break;
        memset(&out[n], 0, sizeof out[n]);
        out[n].pid = (unsigned int)pid;
        out[n].usedGpuMemory = bytes;
        n++;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

static nvmlReturn_t processes(unsigned int *count, nvmlProcessInfo_t *infos, int compute) {
    if (count == NULL) return 1;
    if (strcmp(mode(), "list-fails") == 0) return NVML_ERROR_UNKNOWN;
    nvmlProcessInfo_t all[MAX_PROCS];
    unsigned int n = compute ? listed(all) : 0;
    if (infos == NULL || *count < n) {
        *count = n;
        return n > 0 ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    *count = n;
    memcpy(infos, all, n * sizeof all[0]);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    (void)d;
    return processes(count, infos, 1);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                      nvmlProcessInfo_t *infos) {
    (void)d;
    return processes(count, infos, 0);
}
