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
 * SIMNVML_DEVICES, SIMNVML_NAME: the devices it lists (count, model name; see below), as
 *   `oomshim exporter` asks for DCGM-exporter's labels (tests/exporter.rs).
 */
#define _GNU_SOURCE
#include <stdio.h>
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

/* Devices: SIMNVML_DEVICES (default 1), named SIMNVML_NAME (default "NVIDIA H100 80GB HBM3"),
 * with the UUIDs the simulated driver gives its devices (GPU-5e1d00NN-1415-…, NN the index).
 * A handle is 0x1000 + the index. */
static unsigned int device_count(void) {
    const char *s = getenv("SIMNVML_DEVICES");
    return s != NULL && *s != '\0' ? (unsigned int)strtoul(s, NULL, 10) : 1;
}

static nvmlReturn_t handle(unsigned int index, nvmlDevice_t *device) {
    if (device == NULL) return 1;
    if (strcmp(mode(), "no-device") == 0) return NVML_ERROR_GPU_IS_LOST;
    *device = (nvmlDevice_t)(unsigned long)(0x1000 + index);
    return NVML_SUCCESS;
}

static unsigned int index_of(nvmlDevice_t device) {
    return (unsigned int)((unsigned long)device - 0x1000);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return handle(index, device);
}

/* A UUID of the simulated driver's names its device; any other is device 0 (the tests that
 * list processes pass whatever UUID the dump has). */
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    unsigned int index = 0;
    if (uuid != NULL && strncmp(uuid, "GPU-5e1d", 8) == 0 && strlen(uuid) > 10) {
        char hex[3] = {uuid[8], uuid[9], 0};
        index = (unsigned int)strtoul(hex, NULL, 16);
    }
    return handle(index, device);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (count == NULL) return 1;
    *count = device_count();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    if (index == NULL) return 1;
    *index = index_of(device);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    if (uuid == NULL) return 1;
    snprintf(uuid, length, "GPU-5e1d%02x13-1415-1617-1819-1a1b1c1d1e1f", index_of(device) & 0xff);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    (void)device;
    if (name == NULL) return 1;
    const char *s = getenv("SIMNVML_NAME");
    snprintf(name, length, "%s", s != NULL ? s : "NVIDIA H100 80GB HBM3");
    return NVML_SUCCESS;
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
