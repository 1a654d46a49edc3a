/*
 * A fake libnvidia-ml.so.1 for the orch sandbox.
 *
 * Build: cc -shared -fPIC -O2 -o libnvidia-ml.so.1 fakenvml.c
 *
 * Every call re-reads the JSON scenario: /dev/orch-nvidia/scenario.json where that
 * exists (inside a sandbox LXC container, which gets the directory bind-mounted as a
 * real one gets the GPUs' device nodes; the host's environment that pct leaks in is
 * ignored there), else the file named by $ORCH_FAKE_NVML_SCENARIO, so a
 * test can switch scenario (atomically, temp + rename) while a process keeps
 * NVML initialised. The exported functions, their argument structs and their
 * return codes follow nvml.h as REAL pynvml (nvidia-ml-py) calls them:
 *   - process lists: v1 {pid, usedGpuMemory}; v2/v3 {pid, usedGpuMemory,
 *     gpuInstanceId, computeInstanceId}; the count/INSUFFICIENT_SIZE protocol.
 *   - nvmlDeviceGetMemoryInfo_v2 checks the struct version (0x02000028).
 *   - power is in milliwatts; memory in bytes.
 * Scenario keys (all optional): driver_version, nvml_version,
 * cuda_driver_version (e.g. 12080), init_error (name or code), init_hang_ms,
 * pid_numbering ("host" or "namespace": see visible_pid), host_pidns,
 * devices: [{index, minor, name, uuid, pci_bus_id, util_pct, mem_util_pct, mem_used_mib,
 * mem_total_mib, mem_reserved_mib, temp_c, mem_temp_c, power_w, power_limit_w, sm_clock_mhz,
 * mem_clock_mhz, pstate, energy_avg_w, energy_base_mj, pcie_replay, remapped_rows_correctable,
 * remapped_rows_uncorrectable, remap_pending, remap_failure, enc_util_pct, dec_util_pct,
 * nvlink_links, nvlink_tx_kib_s, nvlink_rx_kib_s, not_supported: [names],
 * processes: [{pid, used_mib, pidns, ns_pid}], lost, hang_ms}].
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define DEFAULT_SCENARIO "/dev/orch-nvidia/scenario.json"

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

/* ------------------------------------------------------------------ tiny JSON */

enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct jv {
    int type;
    double num;
    char *str;       /* J_STR */
    int n;           /* J_ARR / J_OBJ */
    char **keys;     /* J_OBJ */
    struct jv *items;
} jv;

typedef struct {
    const char *p, *end;
    int err;
} jparser;

static void jfree(jv *v) {
    int i;
    if (!v) return;
    free(v->str);
    for (i = 0; i < v->n; i++) {
        jfree(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    memset(v, 0, sizeof *v);
}

static void jws(jparser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static char *jstring(jparser *ps) {
    size_t cap = 16, len = 0;
    char *out;
    if (ps->p >= ps->end || *ps->p != '"') { ps->err = 1; return NULL; }
    ps->p++;
    out = malloc(cap);
    while (ps->p < ps->end && *ps->p != '"') {
        char c = *ps->p++;
        if (c == '\\' && ps->p < ps->end) {
            char e = *ps->p++;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': /* keep ASCII only; anything else becomes '?' */
                if (ps->end - ps->p >= 4) {
                    unsigned code = (unsigned)strtoul((char[5]){ps->p[0], ps->p[1], ps->p[2], ps->p[3], 0}, NULL, 16);
                    c = code < 128 ? (char)code : '?';
                    ps->p += 4;
                }
                break;
            default: c = e;
            }
        }
        if (len + 2 > cap) out = realloc(out, cap *= 2);
        out[len++] = c;
    }
    if (ps->p >= ps->end) { ps->err = 1; free(out); return NULL; }
    ps->p++;
    out[len] = 0;
    return out;
}

static void jvalue(jparser *ps, jv *v, int depth);

static void jpush(jv *v, jv *item, char *key) {
    v->items = realloc(v->items, sizeof(jv) * (size_t)(v->n + 1));
    v->items[v->n] = *item;
    if (v->type == J_OBJ) {
        v->keys = realloc(v->keys, sizeof(char *) * (size_t)(v->n + 1));
        v->keys[v->n] = key;
    }
    v->n++;
}

static void jvalue(jparser *ps, jv *v, int depth) {
    memset(v, 0, sizeof *v);
    jws(ps);
    if (ps->p >= ps->end || depth > 32) { ps->err = 1; return; }
    switch (*ps->p) {
    case '{':
    case '[': {
        char close = *ps->p == '{' ? '}' : ']';
        v->type = close == '}' ? J_OBJ : J_ARR;
        ps->p++;
        jws(ps);
        if (ps->p < ps->end && *ps->p == close) { ps->p++; return; }
        while (!ps->err) {
            jv item;
            char *key = NULL;
            jws(ps);
            if (v->type == J_OBJ) {
                key = jstring(ps);
                if (ps->err) return;
                jws(ps);
                if (ps->p >= ps->end || *ps->p != ':') { free(key); ps->err = 1; return; }
                ps->p++;
            }
            jvalue(ps, &item, depth + 1);
            if (ps->err) { free(key); jfree(&item); return; }
            jpush(v, &item, key);
            jws(ps);
            if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
            if (ps->p < ps->end && *ps->p == close) { ps->p++; return; }
            ps->err = 1;
        }
        return;
    }
    case '"':
        v->type = J_STR;
        v->str = jstring(ps);
        return;
    case 't':
    case 'f':
    case 'n': {
        const char *words[] = {"true", "false", "null"};
        int i;
        for (i = 0; i < 3; i++) {
            size_t l = strlen(words[i]);
            if ((size_t)(ps->end - ps->p) >= l && strncmp(ps->p, words[i], l) == 0) {
                v->type = i == 2 ? J_NULL : J_BOOL;
                v->num = i == 0;
                ps->p += l;
                return;
            }
        }
        ps->err = 1;
        return;
    }
    default: {
        char *endp;
        char buf[64];
        size_t l = (size_t)(ps->end - ps->p) < sizeof buf - 1 ? (size_t)(ps->end - ps->p) : sizeof buf - 1;
        memcpy(buf, ps->p, l);
        buf[l] = 0;
        v->type = J_NUM;
        v->num = strtod(buf, &endp);
        if (endp == buf) { ps->err = 1; return; }
        ps->p += endp - buf;
    }
    }
}

static jv *jget(jv *obj, const char *key) {
    int i;
    if (!obj || obj->type != J_OBJ) return NULL;
    for (i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
    return NULL;
}

static double jnum(jv *obj, const char *key, double dflt) {
    jv *v = jget(obj, key);
    return v && (v->type == J_NUM || v->type == J_BOOL) ? v->num : dflt;
}

static const char *jstr(jv *obj, const char *key, const char *dflt) {
    jv *v = jget(obj, key);
    return v && v->type == J_STR ? v->str : dflt;
}

/* ------------------------------------------------------------------ scenario */

static int g_init_count = 0; /* nvmlInit/nvmlShutdown refcount (atomics) */

typedef struct {
    jv root;
    jv *devices; /* J_ARR or NULL */
} scenario;

static void sleep_ms(double ms) {
    struct timespec ts;
    if (ms <= 0) return;
    ts.tv_sec = (time_t)(ms / 1000);
    ts.tv_nsec = (long)((ms - (double)ts.tv_sec * 1000) * 1e6);
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

static int init_error_code(jv *root) {
    jv *v = jget(root, "init_error");
    if (!v || v->type == J_NULL) return NVML_SUCCESS;
    if (v->type == J_NUM) return (int)v->num;
    if (v->type != J_STR) return NVML_ERROR_UNKNOWN;
    if (!strcmp(v->str, "driver-mismatch")) return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    if (!strcmp(v->str, "driver-not-loaded")) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (!strcmp(v->str, "no-permission")) return NVML_ERROR_NO_PERMISSION;
    if (!strcmp(v->str, "gpu-lost")) return NVML_ERROR_GPU_IS_LOST;
    if (!strcmp(v->str, "reset-required")) return NVML_ERROR_RESET_REQUIRED;
    if (!strcmp(v->str, "timeout")) return NVML_ERROR_TIMEOUT;
    return NVML_ERROR_UNKNOWN;
}

/* Read and parse the scenario; on success the caller must scenario_free(). */
static nvmlReturn_t scenario_load(scenario *s) {
    const char *path = getenv("ORCH_FAKE_NVML_SCENARIO");
    FILE *f;
    char *buf;
    long size;
    jparser ps;
    memset(s, 0, sizeof *s);
    if (access(DEFAULT_SCENARIO, F_OK) == 0) path = DEFAULT_SCENARIO;
    if (!path || !*path) return NVML_ERROR_DRIVER_NOT_LOADED;
    f = fopen(path, "rb");
    if (!f) return NVML_ERROR_DRIVER_NOT_LOADED;
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (size < 0 || size > (16 << 20)) { fclose(f); return NVML_ERROR_UNKNOWN; }
    buf = malloc((size_t)size + 1);
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) { fclose(f); free(buf); return NVML_ERROR_UNKNOWN; }
    fclose(f);
    ps.p = buf;
    ps.end = buf + size;
    ps.err = 0;
    jvalue(&ps, &s->root, 0);
    free(buf);
    if (ps.err || s->root.type != J_OBJ) {
        fprintf(stderr, "fake libnvidia-ml: %s: not a JSON object\n", path);
        jfree(&s->root);
        return NVML_ERROR_UNKNOWN;
    }
    s->devices = jget(&s->root, "devices");
    if (s->devices && s->devices->type != J_ARR) s->devices = NULL;
    return NVML_SUCCESS;
}

static void scenario_free(scenario *s) { jfree(&s->root); }

static int device_count(scenario *s) { return s->devices ? s->devices->n : 0; }

/* Begin a call that needs an initialised library: load the scenario and apply
 * the scenario-wide error (a driver mismatch breaks every call, not only init). */
static nvmlReturn_t begin(scenario *s) {
    nvmlReturn_t rc;
    if (__atomic_load_n(&g_init_count, __ATOMIC_SEQ_CST) <= 0) return NVML_ERROR_UNINITIALIZED;
    rc = scenario_load(s);
    if (rc != NVML_SUCCESS) return rc;
    rc = init_error_code(&s->root);
    if (rc != NVML_SUCCESS) scenario_free(s);
    return rc;
}

#define HANDLE_BASE 0x1000u

/* Begin a device call: the device's hang_ms is slept first, then lost -> GPU_IS_LOST. */
static nvmlReturn_t begin_device(scenario *s, nvmlDevice_t h, jv **dev) {
    uintptr_t raw = (uintptr_t)h;
    nvmlReturn_t rc = begin(s);
    int idx;
    if (rc != NVML_SUCCESS) return rc;
    if (raw < HANDLE_BASE || raw >= HANDLE_BASE + 4096) { scenario_free(s); return NVML_ERROR_INVALID_ARGUMENT; }
    idx = (int)(raw - HANDLE_BASE);
    if (idx >= device_count(s)) { scenario_free(s); return NVML_ERROR_GPU_IS_LOST; }
    *dev = &s->devices->items[idx];
    sleep_ms(jnum(*dev, "hang_ms", 0));
    if (jnum(*dev, "lost", 0)) { scenario_free(s); return NVML_ERROR_GPU_IS_LOST; }
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

static const unsigned default_bus[8] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};

static void bus_id(jv *dev, int idx, char *out, size_t len) {
    const char *given = jstr(dev, "pci_bus_id", NULL);
    if (given) snprintf(out, len, "%s", given);
    else snprintf(out, len, "00000000:%02X:00.0", idx < 8 ? default_bus[idx] : 0xe0u + (unsigned)idx);
}

/* ------------------------------------------------------------------ init / system */

static nvmlReturn_t do_init(void) {
    scenario s;
    nvmlReturn_t rc = scenario_load(&s);
    if (rc != NVML_SUCCESS) return rc;
    sleep_ms(jnum(&s.root, "init_hang_ms", 0));
    rc = init_error_code(&s.root);
    scenario_free(&s);
    if (rc == NVML_SUCCESS) __atomic_add_fetch(&g_init_count, 1, __ATOMIC_SEQ_CST);
    return rc;
}

EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return do_init(); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    if (__atomic_load_n(&g_init_count, __ATOMIC_SEQ_CST) <= 0) return NVML_ERROR_UNINITIALIZED;
    __atomic_sub_fetch(&g_init_count, 1, __ATOMIC_SEQ_CST);
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t rc) {
    switch (rc) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt Request Issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 25: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t system_string(const char *key, const char *dflt, char *out, unsigned int len) {
    scenario s;
    nvmlReturn_t rc = begin(&s);
    if (rc != NVML_SUCCESS) return rc;
    rc = copy_str(out, len, jstr(&s.root, key, dflt));
    scenario_free(&s);
    return rc;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return system_string("driver_version", "570.172.08", version, length);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    return system_string("nvml_version", "12.570.172.08", version, length);
}

static nvmlReturn_t cuda_version(int *out) {
    scenario s;
    nvmlReturn_t rc;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    rc = begin(&s);
    if (rc != NVML_SUCCESS) return rc;
    *out = (int)jnum(&s.root, "cuda_driver_version", 12080);
    scenario_free(&s);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return cuda_version(v); }
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return cuda_version(v); }

/* ------------------------------------------------------------------ device lookup */

static nvmlReturn_t get_count(unsigned int *count) {
    scenario s;
    nvmlReturn_t rc;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    rc = begin(&s);
    if (rc != NVML_SUCCESS) return rc;
    *count = (unsigned)device_count(&s);
    scenario_free(&s);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *c) { return get_count(c); }
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *c) { return get_count(c); }

static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device) {
    scenario s;
    jv *dev;
    nvmlReturn_t rc;
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    rc = begin(&s);
    if (rc != NVML_SUCCESS) return rc;
    if ((int)index >= device_count(&s)) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    scenario_free(&s);
    rc = begin_device(&s, (nvmlDevice_t)(uintptr_t)(HANDLE_BASE + index), &dev);
    if (rc != NVML_SUCCESS) return rc;
    scenario_free(&s);
    *device = (nvmlDevice_t)(uintptr_t)(HANDLE_BASE + index);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return handle_by_index(i, d); }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) { return handle_by_index(i, d); }

static nvmlReturn_t handle_by_key(const char *key, const char *want, nvmlDevice_t *device) {
    scenario s;
    nvmlReturn_t rc;
    int i, n;
    if (!want || !device) return NVML_ERROR_INVALID_ARGUMENT;
    rc = begin(&s);
    if (rc != NVML_SUCCESS) return rc;
    n = device_count(&s);
    for (i = 0; i < n; i++) {
        char bus[64];
        jv *dev = &s.devices->items[i];
        const char *have = jstr(dev, key, "");
        if (!strcmp(key, "pci_bus_id")) { bus_id(dev, i, bus, sizeof bus); have = bus; }
        if (strcasecmp(have, want) == 0) {
            scenario_free(&s);
            return handle_by_index((unsigned)i, device);
        }
    }
    scenario_free(&s);
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) { return handle_by_key("uuid", uuid, d); }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus, nvmlDevice_t *d) { return handle_by_key("pci_bus_id", bus, d); }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *d) { return handle_by_key("pci_bus_id", bus, d); }

/* ------------------------------------------------------------------ device queries */

#define DEVICE_CALL(h, s, dev)                                 \
    scenario s;                                                \
    jv *dev = NULL;                                            \
    nvmlReturn_t rc_ = begin_device(&s, h, &dev);              \
    if (rc_ != NVML_SUCCESS) return rc_;

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t h, unsigned int *index) {
    DEVICE_CALL(h, s, dev)
    if (!index) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    *index = (unsigned)jnum(dev, "index", (double)((uintptr_t)h - HANDLE_BASE));
    scenario_free(&s);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t h, unsigned int *minor) {
    DEVICE_CALL(h, s, dev)
    if (!minor) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    *minor = (unsigned)jnum(dev, "minor", jnum(dev, "index", (double)((uintptr_t)h - HANDLE_BASE)));
    scenario_free(&s);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *name, unsigned int length) {
    nvmlReturn_t rc;
    DEVICE_CALL(h, s, dev)
    rc = copy_str(name, length, jstr(dev, "name", "NVIDIA H200"));
    scenario_free(&s);
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *uuid, unsigned int length) {
    nvmlReturn_t rc;
    char fallback[64];
    DEVICE_CALL(h, s, dev)
    snprintf(fallback, sizeof fallback, "GPU-00000000-0000-0000-0000-%012x", (unsigned)((uintptr_t)h - HANDLE_BASE));
    rc = copy_str(uuid, length, jstr(dev, "uuid", fallback));
    scenario_free(&s);
    return rc;
}

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u) {
    DEVICE_CALL(h, s, dev)
    if (!u) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    u->gpu = (unsigned)jnum(dev, "util_pct", 0);
    u->memory = (unsigned)jnum(dev, "mem_util_pct", u->gpu ? u->gpu / 2 : 0);
    scenario_free(&s);
    return NVML_SUCCESS;
}

#define MIB 1048576ULL

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define NVML_MEMORY_V2 0x02000028u

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m) {
    unsigned long long total, used;
    DEVICE_CALL(h, s, dev)
    if (!m) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    total = (unsigned long long)jnum(dev, "mem_total_mib", 143771) * MIB;
    used = (unsigned long long)(jnum(dev, "mem_used_mib", 0) + jnum(dev, "mem_reserved_mib", 0)) * MIB;
    m->total = total;
    m->used = used;
    m->free = total > used ? total - used : 0;
    scenario_free(&s);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m) {
    unsigned long long total, used, reserved;
    DEVICE_CALL(h, s, dev)
    if (!m) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    if (m->version != NVML_MEMORY_V2) { scenario_free(&s); return NVML_ERROR_ARGUMENT_VERSION_MISMATCH; }
    total = (unsigned long long)jnum(dev, "mem_total_mib", 143771) * MIB;
    used = (unsigned long long)jnum(dev, "mem_used_mib", 0) * MIB;
    reserved = (unsigned long long)jnum(dev, "mem_reserved_mib", 0) * MIB;
    m->total = total;
    m->used = used;
    m->reserved = reserved;
    m->free = total > used + reserved ? total - used - reserved : 0;
    scenario_free(&s);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t h, int sensor, unsigned int *temp) {
    DEVICE_CALL(h, s, dev)
    if (!temp || sensor != 0) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    *temp = (unsigned)jnum(dev, "temp_c", 30);
    scenario_free(&s);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t h, unsigned int *mw) {
    DEVICE_CALL(h, s, dev)
    if (!mw) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    *mw = (unsigned)(jnum(dev, "power_w", 70) * 1000.0 + 0.5);
    scenario_free(&s);
    return NVML_SUCCESS;
}

static nvmlReturn_t power_limit(nvmlDevice_t h, unsigned int *mw) {
    DEVICE_CALL(h, s, dev)
    if (!mw) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    *mw = (unsigned)(jnum(dev, "power_limit_w", 700) * 1000.0 + 0.5);
    scenario_free(&s);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t h, unsigned int *mw) { return power_limit(h, mw); }
EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t h, unsigned int *mw) { return power_limit(h, mw); }

EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t h, int *mode) {
    DEVICE_CALL(h, s, dev)
    if (!mode) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    *mode = 1;
    scenario_free(&s);
    return NVML_SUCCESS;
}

typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;

/* Which PID of process ``p`` the caller gets, 0 when the driver leaves it out.
 * pid_numbering "host" (the default; drivers up to 535.104.05): the host PID, always.
 * "namespace" (535.113.01 and later, 535.43.24-535.43.28): the PID in the caller's PID
 * namespace, and a process that namespace cannot see is left out, as the resource manager's
 * _gpuConvertPid does (open-gpu-kernel-modules 535.113.01,
 * src/nvidia/src/kernel/gpu/gpu_rmapi.c, through os_find_ns_pid's pid_vnr in
 * kernel-open/nvidia/os-interface.c; NV_ERR_OBJECT_NOT_FOUND skips it). The host side (the
 * sandbox's set_scenario) writes each process's "pidns" (readlink /proc/PID/ns/pid) and
 * "ns_pid" (its PID there, NSpid's last) and the host's own "host_pidns". */
static unsigned visible_pid(scenario *s, jv *p, const char *me) {
    unsigned pid = (unsigned)jnum(p, "pid", 0);
    const char *host_ns = jstr(&s->root, "host_pidns", "");
    if (strcmp(jstr(&s->root, "pid_numbering", "host"), "namespace") != 0) return pid;
    if (!me[0] || !strcmp(me, host_ns)) return pid;
    if (!strcmp(jstr(p, "pidns", ""), me)) return (unsigned)jnum(p, "ns_pid", 0);
    return 0;
}

/* The count protocol: infos NULL or *count too small -> *count = needed and
 * INSUFFICIENT_SIZE (SUCCESS when there are none); else fill and set *count. */
static nvmlReturn_t processes(nvmlDevice_t h, unsigned int *count, void *infos, int version, const char *key) {
    jv *list;
    unsigned n = 0, i, k = 0, all;
    char me[64] = "";
    ssize_t len;
    DEVICE_CALL(h, s, dev)
    if (!count) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    len = readlink("/proc/self/ns/pid", me, sizeof me - 1);
    me[len > 0 ? len : 0] = '\0';
    list = jget(dev, key);
    all = list && list->type == J_ARR ? (unsigned)list->n : 0;
    for (i = 0; i < all; i++)
        if (visible_pid(&s, &list->items[i], me)) n++;
    if (n == 0) { *count = 0; scenario_free(&s); return NVML_SUCCESS; }
    if (!infos || *count < n) { *count = n; scenario_free(&s); return NVML_ERROR_INSUFFICIENT_SIZE; }
    for (i = 0; i < all; i++) {
        jv *p = &list->items[i];
        unsigned pid = visible_pid(&s, p, me);
        unsigned long long used = (unsigned long long)jnum(p, "used_mib", 0) * MIB;
        if (!pid) continue;
        if (version == 1) {
            nvmlProcessInfo_v1_t *out = (nvmlProcessInfo_v1_t *)infos + k;
            out->pid = pid;
            out->usedGpuMemory = used;
        } else {
            nvmlProcessInfo_v2_t *out = (nvmlProcessInfo_v2_t *)infos + k;
            out->pid = pid;
            out->usedGpuMemory = used;
            out->gpuInstanceId = 0xFFFFFFFFu; /* NVML_VALUE_NOT_AVAILABLE: not a MIG device */
            out->computeInstanceId = 0xFFFFFFFFu;
        }
        k++;
    }
    *count = n;
    scenario_free(&s);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t h, unsigned int *c, void *p) { return processes(h, c, p, 1, "processes"); }
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t h, unsigned int *c, void *p) { return processes(h, c, p, 2, "processes"); }
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *c, void *p) { return processes(h, c, p, 3, "processes"); }
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t h, unsigned int *c, void *p) { return processes(h, c, p, 1, "graphics_processes"); }
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t h, unsigned int *c, void *p) { return processes(h, c, p, 2, "graphics_processes"); }
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t h, unsigned int *c, void *p) { return processes(h, c, p, 3, "graphics_processes"); }
EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t h, unsigned int *c, void *p) { return processes(h, c, p, 1, "mps_processes"); }
EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t h, unsigned int *c, void *p) { return processes(h, c, p, 2, "mps_processes"); }
EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *c, void *p) { return processes(h, c, p, 3, "mps_processes"); }

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

static nvmlReturn_t pci_info(nvmlDevice_t h, nvmlPciInfo_t *pci) {
    char bus[64];
    unsigned dom = 0, b = 0, d = 0, fn = 0;
    int idx = (int)((uintptr_t)h - HANDLE_BASE);
    DEVICE_CALL(h, s, dev)
    if (!pci) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    bus_id(dev, idx, bus, sizeof bus);
    sscanf(bus, "%x:%x:%x.%x", &dom, &b, &d, &fn);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", dom & 0xffff, b, d, fn);
    snprintf(pci->busId, sizeof pci->busId, "%.31s", bus);
    pci->domain = dom;
    pci->bus = b;
    pci->device = d;
    pci->pciDeviceId = (unsigned)jnum(dev, "pci_device_id", (double)0x233510DEu);
    pci->pciSubSystemId = (unsigned)jnum(dev, "pci_subsystem_id", (double)0x18AB10DEu);
    scenario_free(&s);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t h, nvmlPciInfo_t *p) { return pci_info(h, p); }
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t h, nvmlPciInfo_t *p) { return pci_info(h, p); }
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t h, nvmlPciInfo_t *p) { return pci_info(h, p); }

/* ------------------------------------------------------------------ clocks, energy, errors */

/* A device lacks an entry point or a field when its "not_supported" list names it (a
 * function name such as "nvmlDeviceGetRemappedRows", or a field such as
 * "NVML_FI_DEV_MEMORY_TEMP"): the call then answers NVML_ERROR_NOT_SUPPORTED, as the real
 * driver does on a board without the feature (GDDR boards have no memory sensor; row
 * remapping is Ampere-and-later datacenter only; a PCIe card has no NVLink). */
static int lacks(jv *dev, const char *what) {
    jv *list = jget(dev, "not_supported");
    int i;
    if (!list || list->type != J_ARR) return 0;
    for (i = 0; i < list->n; i++)
        if (list->items[i].type == J_STR && !strcmp(list->items[i].str, what)) return 1;
    return 0;
}

#define UNSUPPORTED_IF_LACKING(s, dev, what)                                      \
    if (lacks(dev, what)) { scenario_free(&s); return NVML_ERROR_NOT_SUPPORTED; }

enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_CLOCK_VIDEO = 3 };

/* Current clocks in MHz; defaults are an H200 SXM's under load (SM 1980, HBM3e 3201). */
EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t h, int type, unsigned int *mhz) {
    double v;
    DEVICE_CALL(h, s, dev)
    UNSUPPORTED_IF_LACKING(s, dev, "nvmlDeviceGetClockInfo")
    if (!mhz) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM: v = jnum(dev, "sm_clock_mhz", 1980); break;
    case NVML_CLOCK_MEM: v = jnum(dev, "mem_clock_mhz", 3201); break;
    case NVML_CLOCK_VIDEO: v = jnum(dev, "video_clock_mhz", 1755); break;
    default: scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT;
    }
    *mhz = (unsigned)v;
    scenario_free(&s);
    return NVML_SUCCESS;
}

/* nvmlPstates_t: 0 (P0, fastest) .. 15, 32 = NVML_PSTATE_UNKNOWN. */
EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t h, int *pstate) {
    DEVICE_CALL(h, s, dev)
    UNSUPPORTED_IF_LACKING(s, dev, "nvmlDeviceGetPerformanceState")
    if (!pstate) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    *pstate = (int)jnum(dev, "pstate", 0);
    scenario_free(&s);
    return NVML_SUCCESS;
}

static double boot_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Millijoules since the driver loaded (taken as boot): "energy_base_mj" plus
 * "energy_avg_w" (default 400) times the seconds since boot. The slope is its own key, not
 * power_w, so the counter never runs backwards when a test switches scenario, and every
 * process (host observer, each container's agent) reads the same value for one GPU. */
EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t h, unsigned long long *mj) {
    DEVICE_CALL(h, s, dev)
    UNSUPPORTED_IF_LACKING(s, dev, "nvmlDeviceGetTotalEnergyConsumption")
    if (!mj) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    *mj = (unsigned long long)(jnum(dev, "energy_base_mj", 0) + jnum(dev, "energy_avg_w", 400) * 1000.0 * boot_seconds());
    scenario_free(&s);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t h, unsigned int *count) {
    DEVICE_CALL(h, s, dev)
    UNSUPPORTED_IF_LACKING(s, dev, "nvmlDeviceGetPcieReplayCounter")
    if (!count) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    *count = (unsigned)jnum(dev, "pcie_replay", 0);
    scenario_free(&s);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t h, unsigned int *corr, unsigned int *unc,
                                              unsigned int *pending, unsigned int *failure) {
    DEVICE_CALL(h, s, dev)
    UNSUPPORTED_IF_LACKING(s, dev, "nvmlDeviceGetRemappedRows")
    if (!corr || !unc || !pending || !failure) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    *corr = (unsigned)jnum(dev, "remapped_rows_correctable", 0);
    *unc = (unsigned)jnum(dev, "remapped_rows_uncorrectable", 0);
    *pending = (unsigned)jnum(dev, "remap_pending", 0);
    *failure = (unsigned)jnum(dev, "remap_failure", 0);
    scenario_free(&s);
    return NVML_SUCCESS;
}

static nvmlReturn_t engine_util(nvmlDevice_t h, const char *fn, const char *key, unsigned int *util, unsigned int *period_us) {
    DEVICE_CALL(h, s, dev)
    UNSUPPORTED_IF_LACKING(s, dev, fn)
    if (!util || !period_us) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    *util = (unsigned)jnum(dev, key, 0);
    *period_us = 167000;
    scenario_free(&s);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t h, unsigned int *u, unsigned int *p) {
    return engine_util(h, "nvmlDeviceGetEncoderUtilization", "enc_util_pct", u, p);
}
EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t h, unsigned int *u, unsigned int *p) {
    return engine_util(h, "nvmlDeviceGetDecoderUtilization", "dec_util_pct", u, p);
}

/* nvmlFieldValue_t and the fields modelled (nvml.h: NVML_FI_DEV_MEMORY_TEMP 82,
 * NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX 138 / _RX 139, in KiB; scopeId is the link, or
 * UINT_MAX for all links together, as DCGM's ReadAndCacheNvLinkBandwidth passes it). A field
 * the device lacks gets NOT_SUPPORTED in its own nvmlReturn; the call still succeeds. */
typedef union { double dVal; unsigned int uiVal; unsigned long ulVal; unsigned long long ullVal; long long sllVal; int siVal; unsigned short usVal; } nvmlValue_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType, nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

enum { NVML_FI_DEV_MEMORY_TEMP = 82, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139 };
enum { NVML_VALUE_TYPE_UNSIGNED_INT = 1, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3 };

#define NVLINK_SLOTS 64
/* The NVLink byte counters, one per device and direction, kept by this process: they grow
 * at the scenario's "nvlink_tx_kib_s" / "nvlink_rx_kib_s" from a start of rate x uptime, so a
 * rate between two readings is the scenario's whatever it was switched from. */
static double g_nvlink_kib[NVLINK_SLOTS][2], g_nvlink_at[NVLINK_SLOTS][2];
static char g_nvlink_lock;

static unsigned long long nvlink_kib(int idx, int rx, double rate) {
    double now = boot_seconds(), value;
    if (idx < 0 || idx >= NVLINK_SLOTS) return (unsigned long long)(rate * now);
    while (__atomic_test_and_set(&g_nvlink_lock, __ATOMIC_ACQUIRE)) {
    }
    if (g_nvlink_at[idx][rx] == 0) g_nvlink_kib[idx][rx] = rate * now;
    else g_nvlink_kib[idx][rx] += rate * (now - g_nvlink_at[idx][rx]);
    g_nvlink_at[idx][rx] = now;
    value = g_nvlink_kib[idx][rx];
    __atomic_clear(&g_nvlink_lock, __ATOMIC_RELEASE);
    return (unsigned long long)value;
}

static void field_value(jv *dev, int idx, nvmlFieldValue_t *fv) {
    struct timespec ts;
    int links = (int)jnum(dev, "nvlink_links", 18);
    clock_gettime(CLOCK_REALTIME, &ts);
    fv->timestamp = (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
    fv->latencyUsec = 0;
    fv->nvmlReturn = NVML_SUCCESS;
    switch (fv->fieldId) {
    case NVML_FI_DEV_MEMORY_TEMP:
        if (lacks(dev, "NVML_FI_DEV_MEMORY_TEMP")) { fv->nvmlReturn = NVML_ERROR_NOT_SUPPORTED; return; }
        fv->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        fv->value.uiVal = (unsigned)jnum(dev, "mem_temp_c", jnum(dev, "temp_c", 30) + 4);
        return;
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: {
        int rx = fv->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX;
        double rate = jnum(dev, rx ? "nvlink_rx_kib_s" : "nvlink_tx_kib_s", 0);
        if (links <= 0 || lacks(dev, rx ? "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX" : "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX")) {
            fv->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            return;
        }
        if (fv->scopeId != 0xFFFFFFFFu && fv->scopeId >= (unsigned)links) { fv->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT; return; }
        fv->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        fv->value.ullVal = nvlink_kib(idx, rx, rate);
        if (fv->scopeId != 0xFFFFFFFFu) fv->value.ullVal /= (unsigned)links; /* one link's share */
        return;
    }
    default:
        fv->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t h, int count, nvmlFieldValue_t *values) {
    int i, idx = (int)((uintptr_t)h - HANDLE_BASE);
    DEVICE_CALL(h, s, dev)
    if (!values || count <= 0) { scenario_free(&s); return NVML_ERROR_INVALID_ARGUMENT; }
    for (i = 0; i < count; i++) field_value(dev, idx, &values[i]);
    scenario_free(&s);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ not supported here */

/* A device call the fake does not model: it still honours lost/hang, then says NOT_SUPPORTED. */
#define NOT_SUPPORTED_DEVICE(name, ...)                                   \
    EXPORT nvmlReturn_t name(nvmlDevice_t h, __VA_ARGS__) {               \
        DEVICE_CALL(h, s, dev)                                            \
        (void)dev;                                                        \
        scenario_free(&s);                                                \
        return NVML_ERROR_NOT_SUPPORTED;                                  \
    }

NOT_SUPPORTED_DEVICE(nvmlDeviceGetFanSpeed, unsigned int *a)
NOT_SUPPORTED_DEVICE(nvmlDeviceGetFanSpeed_v2, unsigned int a, unsigned int *b)
NOT_SUPPORTED_DEVICE(nvmlDeviceGetProcessUtilization, void *a, unsigned int *b, unsigned long long c)
NOT_SUPPORTED_DEVICE(nvmlDeviceGetMaxClockInfo, int a, unsigned int *b)
NOT_SUPPORTED_DEVICE(nvmlDeviceGetTotalEccErrors, int a, int b, unsigned long long *c)
NOT_SUPPORTED_DEVICE(nvmlDeviceGetSupportedEventTypes, unsigned long long *a)
NOT_SUPPORTED_DEVICE(nvmlDeviceGetPcieThroughput, int a, unsigned int *b)
NOT_SUPPORTED_DEVICE(nvmlDeviceGetBAR1MemoryInfo, void *a)
NOT_SUPPORTED_DEVICE(nvmlDeviceRegisterEvents, unsigned long long a, void *b)

EXPORT nvmlReturn_t nvmlEventSetCreate(void **set) {
    scenario s;
    nvmlReturn_t rc = begin(&s);
    (void)set;
    if (rc != NVML_SUCCESS) return rc;
    scenario_free(&s);
    return NVML_ERROR_NOT_SUPPORTED;
}
